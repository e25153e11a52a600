//! Raw YAML structs → runtime [`Config`], with errors that name the field,
//! the value and the reason.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use super::raw::{RawConfig, RawEndpoint, RawHealth, RawRouting, RawServer};
use super::{
    Config, EndpointConfig, HealthConfig, InstanceConfig, RoutingConfig, ServerConfig, Timeouts,
};
use kvgate_routing::Strategy;
// Shared with `kvgate simulate` (kvgate-simulate), so they live with the policies.
pub use kvgate_routing::defaults::{
    DEFAULT_CACHE_AWARE_BALANCE_FACTOR, DEFAULT_CACHE_AWARE_THRESHOLD, DEFAULT_MAX_PROMPT_BLOCKS,
    DEFAULT_PREFIX_LENGTH,
};

pub use crate::error::ConfigError;

pub const DEFAULT_MAX_BODY_BYTES: u64 = 10 * 1024 * 1024;
/// Open client connections before the accept loop waits for one to close.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;
pub const DEFAULT_CONCURRENCY_THRESHOLD: u64 = 10;
pub const DEFAULT_VIRTUAL_NODES: u64 = 160;
/// 256 characters ≈ 64 tokens: four vLLM blocks, fine enough to follow a
/// conversation turn by turn, coarse enough to keep the index small.
pub const DEFAULT_BLOCK_CHARS: u64 = 256;
/// kvgate-sim's preset and a typical 8B–70B vLLM instance: 384k tokens of KV.
pub const DEFAULT_CACHE_TOKENS: u64 = 384_000;

pub(super) fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let server = server(raw.server)?;
    if raw.endpoints.is_empty() {
        return Err(ConfigError::new(
            "endpoints",
            "at least one endpoint is required",
        ));
    }
    let mut names = HashSet::new();
    let mut models = HashSet::new();
    let mut endpoints = Vec::with_capacity(raw.endpoints.len());
    for (i, e) in raw.endpoints.into_iter().enumerate() {
        let ep = endpoint(i, e)?;
        if !names.insert(ep.name.clone()) {
            return Err(ConfigError::new(
                format!("endpoints[{i}].name"),
                format!("{:?} is used by two endpoints", ep.name),
            ));
        }
        for m in &ep.models {
            if !models.insert(m.clone()) {
                return Err(ConfigError::new(
                    format!("endpoints[{i}].models"),
                    format!("model {m:?} is served by two endpoints; a model must map to one"),
                ));
            }
        }
        endpoints.push(ep);
    }
    let served: std::collections::HashSet<&str> = endpoints
        .iter()
        .flat_map(|e| e.models.iter().map(String::as_str))
        .collect();
    let tenancy =
        crate::tenancy::settings::validate(raw.auth, raw.tenants, raw.isolation, &served)?;
    let cluster = crate::tenancy::cluster::settings::validate(raw.cluster)?;
    Ok(Config {
        server,
        endpoints,
        tenancy,
        admin: crate::tenancy::admin::validate(raw.admin)?,
        upstream_tls: crate::config::tls::validate(raw.upstream)?,
        cluster,
        queue: super::queue::validate(raw.queue)?,
    })
}

fn server(raw: RawServer) -> Result<ServerConfig, ConfigError> {
    let listen_text = raw.listen.unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    // An IP address, or a host name such as localhost resolved once here.
    let listen: SocketAddr = listen_text
        .parse()
        .ok()
        .or_else(|| {
            std::net::ToSocketAddrs::to_socket_addrs(listen_text.as_str())
                .ok()?
                .min_by_key(|a| a.is_ipv6())
        })
        .ok_or_else(|| {
            ConfigError::new(
                "server.listen",
                format!("{listen_text:?} is not an address like 127.0.0.1:8080 or localhost:8080"),
            )
        })?;
    let max_body = raw.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    in_range("server.max_body_bytes", max_body, 1024, 1 << 30)?;
    let t = raw.timeouts.unwrap_or_default();
    let ms = |field: &str, v: Option<u64>, default: u64| -> Result<Duration, ConfigError> {
        let v = v.unwrap_or(default);
        in_range(field, v, 1, 24 * 3600 * 1000)?;
        Ok(Duration::from_millis(v))
    };
    Ok(ServerConfig {
        listen,
        max_body_bytes: usize::try_from(max_body).unwrap_or(usize::MAX),
        timeouts: Timeouts {
            connect: ms("server.timeouts.connect_ms", t.connect_ms, 2_000)?,
            first_byte: ms("server.timeouts.first_byte_ms", t.first_byte_ms, 300_000)?,
            idle: ms("server.timeouts.idle_ms", t.idle_ms, 120_000)?,
            header_read: ms("server.timeouts.header_read_ms", t.header_read_ms, 10_000)?,
            body_read: ms("server.timeouts.body_read_ms", t.body_read_ms, 30_000)?,
            client_idle: ms("server.timeouts.client_idle_ms", t.client_idle_ms, 75_000)?,
        },
        failover_cooldown: ms(
            "server.failover_cooldown_ms",
            raw.failover_cooldown_ms,
            5_000,
        )?,
        shutdown_grace: ms("server.shutdown_grace_ms", raw.shutdown_grace_ms, 30_000)?,
        sse_keepalive: match raw.sse_keepalive_ms {
            Some(0) => None,
            v => Some(ms("server.sse_keepalive_ms", v, 15_000)?),
        },
        max_connections: {
            let n = raw.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
            in_range("server.max_connections", n, 1, 1_000_000)?;
            usize::try_from(n).unwrap_or(usize::MAX)
        },
        http2_keepalive: match raw.http2_keepalive_ms {
            Some(0) => None,
            v => Some(ms("server.http2_keepalive_ms", v, 20_000)?),
        },
        access_log: raw.access_log.unwrap_or(false),
        workers: match raw.workers {
            Some(n) => {
                in_range("server.workers", n, 1, 1024)?;
                usize::try_from(n).unwrap_or(1)
            }
            None => std::thread::available_parallelism().map_or(1, |n| n.get().min(1024)),
        },
    })
}

fn endpoint(i: usize, raw: RawEndpoint) -> Result<EndpointConfig, ConfigError> {
    let at = |f: &str| format!("endpoints[{i}].{f}");
    if raw.name.is_empty()
        || !raw
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(ConfigError::new(
            at("name"),
            format!(
                "{:?} must be non-empty and use only letters, digits, '-', '_' or '.' (it appears in URLs)",
                raw.name
            ),
        ));
    }
    for (j, m) in raw.models.iter().enumerate() {
        if m.is_empty() {
            return Err(ConfigError::new(
                at(&format!("models[{j}]")),
                "empty model name",
            ));
        }
    }
    if raw.instances.is_empty() && raw.discovery.is_none() {
        return Err(ConfigError::new(
            at("instances"),
            "at least one instance is required (or a discovery section)",
        ));
    }
    let discovery = raw
        .discovery
        .map(|d| super::discovery::validate(&at("discovery"), d))
        .transpose()?;
    let mut ids = HashSet::new();
    let mut instances = Vec::with_capacity(raw.instances.len());
    for (j, inst) in raw.instances.into_iter().enumerate() {
        let url = inst.url.trim_end_matches('/').to_owned();
        let ok = (url.starts_with("http://") || url.starts_with("https://"))
            && reqwest::Url::parse(&url).is_ok_and(|u| u.host_str().is_some());
        if !ok {
            return Err(ConfigError::new(
                at(&format!("instances[{j}].url")),
                format!(
                    "{:?} is not an http:// or https:// URL with a host",
                    inst.url
                ),
            ));
        }
        if let Some(base) = url.strip_suffix("/v1") {
            return Err(ConfigError::new(
                at(&format!("instances[{j}].url")),
                format!(
                    "{:?} ends in /v1: kvgate adds the API path (/v1/chat/completions) itself; use {base:?}",
                    inst.url
                ),
            ));
        }
        let id = inst.id.unwrap_or_else(|| url.clone());
        if !ids.insert(id.clone()) {
            return Err(ConfigError::new(
                at(&format!("instances[{j}]")),
                format!(
                    "instance id {id:?} appears twice; ids place instances on the ring and must be unique"
                ),
            ));
        }
        let cache_tokens = match inst.cache_tokens {
            Some(t) => Some(cache_tokens(
                &at(&format!("instances[{j}].cache_tokens")),
                t,
            )?),
            None => None,
        };
        instances.push((
            InstanceConfig {
                id,
                url,
                cache_tokens: 0,
                learn_cache_tokens: false,
                kv_events: None,
                kv_replay: None,
                discovered: false,
            },
            cache_tokens,
            (inst.kv_events, inst.kv_replay),
        ));
    }
    let health = raw.health.map(|h| health(&at("health"), h)).transpose()?;
    let routing = routing(&at("routing"), raw.routing)?;
    let instances = instances
        .into_iter()
        .enumerate()
        .map(|(j, (mut ic, own, (events, replay)))| {
            ic.cache_tokens = own.unwrap_or(routing.cache_tokens);
            ic.learn_cache_tokens = own.is_none() && !routing.cache_tokens_configured;
            super::kv_aware::instance_sockets(
                &at(&format!("instances[{j}]")),
                &mut ic,
                events.as_deref(),
                replay.as_deref(),
                routing.kv.as_ref(),
            )?;
            Ok(ic)
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(EndpointConfig {
        name: raw.name,
        models: raw.models,
        instances,
        routing,
        health,
        upstream_authorization: crate::tenancy::settings::upstream_authorization(
            &at("upstream_api_key"),
            raw.upstream_api_key,
        )?,
        discovery,
    })
}

fn routing(at: &str, raw: RawRouting) -> Result<RoutingConfig, ConfigError> {
    let f = |name: &str| format!("{at}.{name}");
    let strategy = match raw.strategy.as_deref() {
        None => Strategy::PrefixAware,
        Some(s) => Strategy::parse(s).ok_or_else(|| {
            ConfigError::new(
                f("strategy"),
                format!("{s:?} is not one of prefix_aware, longest_prefix, kv_aware, least_outstanding_requests, random, round_robin"),
            )
        })?,
    };
    let kv = super::kv_aware::kv_aware(at, strategy.uses_events(), &raw)?;
    let warmup = super::kv_aware::warmup(at, raw.warmup.as_ref())?;
    let prefix_length = raw.prefix_length.unwrap_or(DEFAULT_PREFIX_LENGTH);
    in_range(&f("prefix_length"), prefix_length, 1024, 65536)?;
    let threshold = raw
        .concurrency_threshold
        .unwrap_or(if strategy.uses_index() {
            DEFAULT_CACHE_AWARE_THRESHOLD
        } else {
            DEFAULT_CONCURRENCY_THRESHOLD
        });
    in_range(&f("concurrency_threshold"), threshold, 1, 1024)?;
    let vnodes = raw.virtual_nodes.unwrap_or(DEFAULT_VIRTUAL_NODES);
    in_range(&f("virtual_nodes"), vnodes, 1, 4096)?;
    if let Some(c) = raw.balance_factor
        && !(c > 1.0 && c <= 100.0)
    {
        return Err(ConfigError::new(
            f("balance_factor"),
            format!("{c} must be above 1.0 (1.25 allows 25% above the mean load) and at most 100"),
        ));
    }
    let prompt_members = match raw.prompt_members {
        Some(m) if m.is_empty() => {
            return Err(ConfigError::new(
                f("prompt_members"),
                "must name at least one member",
            ));
        }
        Some(m) => m,
        None => kvgate_prefix::DEFAULT_PROMPT_MEMBERS
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
    };
    let block_chars = raw.block_chars.unwrap_or(DEFAULT_BLOCK_CHARS);
    in_range(&f("block_chars"), block_chars, 16, 65536)?;
    let max_blocks = raw.max_prompt_blocks.unwrap_or(DEFAULT_MAX_PROMPT_BLOCKS);
    in_range(&f("max_prompt_blocks"), max_blocks, 1, 65536)?;
    let cache = cache_tokens(
        &f("cache_tokens"),
        raw.cache_tokens.unwrap_or(DEFAULT_CACHE_TOKENS),
    )?;
    Ok(RoutingConfig {
        kv,
        warmup,
        block_chars: usize::try_from(block_chars).unwrap_or(usize::MAX),
        max_prompt_blocks: usize::try_from(max_blocks).unwrap_or(usize::MAX),
        cache_tokens: cache,
        cache_tokens_configured: raw.cache_tokens.is_some(),
        strategy,
        strategy_as_written: raw.strategy,
        prefix_length: usize::try_from(prefix_length).unwrap_or(usize::MAX),
        concurrency_threshold: usize::try_from(threshold).unwrap_or(usize::MAX),
        balance_factor: raw.balance_factor.or_else(|| {
            strategy
                .uses_index()
                .then_some(DEFAULT_CACHE_AWARE_BALANCE_FACTOR)
        }),
        virtual_nodes: usize::try_from(vnodes).unwrap_or(usize::MAX),
        prompt_members,
    })
}

fn health(at: &str, raw: RawHealth) -> Result<HealthConfig, ConfigError> {
    let f = |name: &str| format!("{at}.{name}");
    let path = raw.path.unwrap_or_else(|| "/health".to_owned());
    if !path.starts_with('/') {
        return Err(ConfigError::new(
            f("path"),
            format!("{path:?} must start with '/'"),
        ));
    }
    let interval = raw.interval_ms.unwrap_or(5_000);
    in_range(&f("interval_ms"), interval, 100, 3_600_000)?;
    let timeout = raw.timeout_ms.unwrap_or(2_000);
    in_range(&f("timeout_ms"), timeout, 10, 600_000)?;
    let up = raw.healthy_threshold.unwrap_or(2);
    in_range(&f("healthy_threshold"), up, 1, 100)?;
    let down = raw.unhealthy_threshold.unwrap_or(3);
    in_range(&f("unhealthy_threshold"), down, 1, 100)?;
    Ok(HealthConfig {
        path,
        interval: Duration::from_millis(interval),
        timeout: Duration::from_millis(timeout),
        healthy_threshold: u32::try_from(up).unwrap_or(2),
        unhealthy_threshold: u32::try_from(down).unwrap_or(3),
    })
}

/// A KV capacity in tokens: 1,024 (a toy) ..= 2^32 (far beyond any GPU).
fn cache_tokens(field: &str, v: u64) -> Result<usize, ConfigError> {
    in_range(field, v, 1024, 1 << 32)?;
    Ok(usize::try_from(v).unwrap_or(usize::MAX))
}

fn in_range(field: &str, v: u64, lo: u64, hi: u64) -> Result<(), ConfigError> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("{v} is outside {lo}..={hi}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const OK: &str = r#"
endpoints:
  - name: chat
    models: ["m"]
    instances:
      - url: "http://10.0.0.1:8000"
"#;

    fn err(yaml: &str) -> String {
        Config::from_yaml(yaml).map(|_| ()).unwrap_err().to_string()
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::from_yaml(OK).unwrap();
        let r = &c.endpoints[0].routing;
        assert_eq!((r.prefix_length, r.concurrency_threshold), (4096, 10));
        assert_eq!(c.endpoints[0].instances[0].id, "http://10.0.0.1:8000");
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
    }

    #[test]
    fn the_access_log_is_off_unless_asked_and_only_a_bool() {
        assert!(!Config::from_yaml(OK).unwrap().server.access_log);
        let on = Config::from_yaml(&format!("server:\n  access_log: true\n{OK}")).unwrap();
        assert!(on.server.access_log);
        let e = err(&format!("server:\n  access_log: loud\n{OK}"));
        assert!(e.contains("access_log"), "{e}");
    }

    #[test]
    fn errors_name_the_field_and_reason() {
        let e = err(&OK.replace("models:", "modles:"));
        assert!(e.contains("modles"), "{e}");
        let e = err(&format!("{OK}    routing: {{ prefix_length: 100 }}\n"));
        assert!(
            e.contains("endpoints[0].routing.prefix_length") && e.contains("1024..=65536"),
            "{e}"
        );
        let e = err(&format!(
            "{OK}    routing: {{ concurrency_threshold: 2000 }}\n"
        ));
        assert!(e.contains("concurrency_threshold"), "{e}");
        let e = err(&format!("{OK}    routing: {{ strategy: fastest }}\n"));
        assert!(
            e.contains("endpoints[0].routing.strategy") && e.contains("fastest"),
            "{e}"
        );
        let e = err(&OK.replace("http://10.0.0.1:8000", "10.0.0.1:8000"));
        assert!(e.contains("endpoints[0].instances[0].url"), "{e}");
        let e = err(&format!(
            "{OK}  - name: chat\n    instances:\n      - url: \"http://a:1\"\n"
        ));
        assert!(e.contains("endpoints[1].name"), "{e}");
        let e = err("server:\n  listen: nowhere\nendpoints: []\n");
        assert!(e.contains("server.listen"), "{e}");
        let c = Config::from_yaml(&format!(
            "server:\n  listen: localhost:9090\n{}",
            OK.trim_start()
        ));
        assert_eq!(
            c.map(|c| c.server.listen.port()).map_err(|e| e.to_string()),
            Ok(9090)
        );
        let e = err(&OK.replace("http://10.0.0.1:8000\"", "http://10.0.0.1:8000/v1\""));
        assert!(
            e.contains("instances[0].url") && e.contains("/v1/chat/completions"),
            "{e}"
        );
    }

    #[test]
    fn sagemaker_strategy_spellings_are_accepted() {
        for s in [
            "PREFIX_AWARE",
            "LEAST_OUTSTANDING_REQUESTS",
            "RANDOM",
            "round_robin",
        ] {
            Config::from_yaml(&format!("{OK}    routing: {{ strategy: {s} }}\n")).unwrap();
        }
    }

    #[test]
    fn hyperpod_prefixaware_means_longest_prefix_and_sagemaker_keeps_hashing() {
        let strategy = |s: &str| {
            Config::from_yaml(&format!("{OK}    routing: {{ strategy: {s} }}\n"))
                .unwrap()
                .endpoints[0]
                .routing
                .clone()
        };
        for s in ["prefixaware", "longest_prefix", "PrefixAware"] {
            let r = strategy(s);
            assert_eq!(r.strategy, kvgate_routing::Strategy::LongestPrefix, "{s}");
            assert_eq!(r.strategy_as_written.as_deref(), Some(s));
            // Its own defaults: the cost model balances, the threshold only guards.
            assert_eq!((r.concurrency_threshold, r.block_chars), (256, 256));
            assert_eq!((r.cache_tokens, r.max_prompt_blocks), (384_000, 1024));
        }
        // No cache_tokens anywhere: learned from the engine; written: kept.
        let learn = |routing: &str, inst: &str| {
            let y = OK.replace("8000\"", &format!("8000\"{inst}"));
            Config::from_yaml(&format!(
                "{y}    routing: {{ strategy: longest_prefix{routing} }}\n"
            ))
            .unwrap()
            .endpoints[0]
                .instances[0]
                .learn_cache_tokens
        };
        assert!(learn("", ""));
        assert!(!learn(", cache_tokens: 100000", ""));
        assert!(!learn("", "\n        cache_tokens: 100000"));
        for s in ["PREFIX_AWARE", "prefix_aware", "prefix-aware"] {
            assert_eq!(
                strategy(s).strategy,
                kvgate_routing::Strategy::PrefixAware,
                "{s}"
            );
        }
    }

    #[test]
    fn cache_aware_keys_are_range_checked_and_named() {
        for (yaml, field, range) in [
            ("block_chars: 8", "routing.block_chars", "16..=65536"),
            (
                "max_prompt_blocks: 0",
                "routing.max_prompt_blocks",
                "1..=65536",
            ),
            ("cache_tokens: 10", "routing.cache_tokens", "1024..="),
        ] {
            let e = err(&format!(
                "{OK}    routing: {{ strategy: longest_prefix, {yaml} }}\n"
            ));
            assert!(
                e.contains(&format!("endpoints[0].{field}")) && e.contains(range),
                "{e}"
            );
        }
        let e = err(&OK.replace(
            "http://10.0.0.1:8000\"",
            "http://10.0.0.1:8000\"\n        cache_tokens: 5",
        ));
        assert!(e.contains("instances[0].cache_tokens"), "{e}");
    }

    #[test]
    fn the_example_config_is_valid() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml");
        Config::load(std::path::Path::new(path)).unwrap();
    }

    #[test]
    fn client_connection_limits_have_defaults_and_ranges() {
        let c = Config::from_yaml(OK).unwrap();
        assert_eq!(c.server.timeouts.client_idle.as_millis(), 75_000);
        assert_eq!(c.server.max_connections, 10_000);
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(c.server.workers, cpus, "one worker a CPU by default");
        assert_eq!(
            c.server.http2_keepalive.map(|d| d.as_millis()),
            Some(20_000)
        );
        let with = |server: &str| format!("server:\n{server}{OK}");
        let off = Config::from_yaml(&with("  http2_keepalive_ms: 0\n")).unwrap();
        assert_eq!(off.server.http2_keepalive, None);
        for (server, field) in [
            ("  max_connections: 0\n", "server.max_connections"),
            ("  workers: 0\n", "server.workers"),
            ("  workers: 5000\n", "server.workers"),
            (
                "  timeouts: { client_idle_ms: 0 }\n",
                "server.timeouts.client_idle_ms",
            ),
        ] {
            let e = err(&with(server));
            assert!(e.contains(field), "{e}");
        }
    }
}
