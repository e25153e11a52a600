//! The gateway's YAML for one run: one endpoint in front of the fleet, routed
//! as the arm says (with `kv_aware`'s tokenizer and event sockets when it is
//! that arm, and `cache_tokens` only when the regime configures it).

use crate::arm::Arm;
use crate::regime::Capacity;
use crate::workload::Setup;

/// One instance as the gateway is told of it.
#[derive(Clone, Debug)]
pub struct InstanceSpec {
    pub url: String,
    pub id: String,
    /// Its KV-event PUB and replay ROUTER sockets (`kv_aware` only).
    pub kv: Option<(String, String)>,
}

/// The gateway's YAML: one endpoint serving model `endpoint`, the instances
/// (ids `sim-0` … in fleet order), health probes left at their defaults;
/// `tokenizer` is the path `kv_aware` loads.
pub fn yaml(setup: &Setup, arm: Arm, endpoint: &str, instances: &[InstanceSpec]) -> String {
    let instances: String = instances
        .iter()
        .map(|i| {
            let kv = i.kv.as_ref().map_or_else(String::new, |(events, replay)| {
                format!("        kv_events: \"{events}\"\n        kv_replay: \"{replay}\"\n")
            });
            format!("      - url: \"{}\"\n        id: \"{}\"\n{kv}", i.url, i.id)
        })
        .collect();
    let r = arm.routing(setup.routing);
    let balance = r
        .balance_factor
        .map(|c| format!("      balance_factor: {c}\n"))
        .unwrap_or_default();
    // `longest_prefix` and `kv_aware` run on their own defaults (threshold,
    // balance factor) but for the index (kv_aware's fallback), sized to what
    // the instances really hold.
    let (threshold, cache) = if arm.cache_aware_defaults() {
        let sim = if arm.uses_events() {
            setup.kv_sim()
        } else {
            setup.sim.clone()
        };
        let tokens = sim.cache_blocks.saturating_mul(sim.block_size);
        // Learned or unknown: no `cache_tokens`, so the gateway learns it or
        // assumes its default.
        let cache = if setup.regime.capacity == Capacity::Configured {
            format!("      cache_tokens: {tokens}\n")
        } else {
            String::new()
        };
        (String::new(), cache)
    } else {
        (
            format!("      concurrency_threshold: {}\n", r.concurrency_threshold),
            String::new(),
        )
    };
    let kv = if arm.uses_events() {
        format!(
            "      block_size: {}\n      tokenizer: \"{}\"\n",
            setup.sim.block_size,
            crate::tokenizer::path_str()
        )
    } else {
        String::new()
    };
    format!(
        r#"server:
  listen: "127.0.0.1:0"
  max_body_bytes: 16777216
  sse_keepalive_ms: 0
  timeouts:
    first_byte_ms: 3600000
    idle_ms: 3600000
endpoints:
  - name: "{endpoint}"
    models: ["{endpoint}"]
    instances:
{instances}    routing:
      strategy: {strategy}
      prefix_length: {prefix_length}
{threshold}{balance}{cache}{kv}"#,
        strategy = arm.strategy().as_str(),
        prefix_length = r.prefix_length,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Kind;

    fn parsed(setup: &Setup, arm: Arm) -> (String, kvgate::Config) {
        let instances: Vec<InstanceSpec> = (0..setup.instances)
            .map(|i| InstanceSpec {
                url: format!("http://127.0.0.1:{}", 9000 + i),
                id: format!("sim-{i}"),
                kv: arm.uses_events().then(|| {
                    (
                        format!("tcp://127.0.0.1:{}", 7000 + i),
                        format!("tcp://127.0.0.1:{}", 8000 + i),
                    )
                }),
            })
            .collect();
        let yaml = yaml(setup, arm, "e", &instances);
        let config = kvgate::Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        (yaml, config)
    }

    #[test]
    fn longest_prefix_gets_the_scaled_cache_and_its_own_balance_default() {
        let mut setup = Kind::LongContext
            .setup(true, 1, std::path::Path::new("."))
            .unwrap();
        setup.scale_cache(4.0);
        assert_eq!(setup.sim.cache_blocks, 96_000);
        let (yaml, config) = parsed(&setup, Arm::LongestPrefix);
        let r = &config.endpoints[0].routing;
        assert_eq!(r.strategy.as_str(), "longest_prefix", "{yaml}");
        assert_eq!(r.cache_tokens, 96_000 * 16, "{yaml}");
        assert!(!yaml.contains("balance_factor"), "{yaml}");
        assert!(!yaml.contains("tokenizer"), "{yaml}");
        assert_eq!(
            r.balance_factor,
            Some(kvgate::config::DEFAULT_CACHE_AWARE_BALANCE_FACTOR)
        );
        assert_eq!(
            r.concurrency_threshold as u64,
            kvgate::config::DEFAULT_CACHE_AWARE_THRESHOLD
        );

        let (yaml, config) = parsed(&setup, Arm::PrefixAware);
        let r = &config.endpoints[0].routing;
        assert_eq!(r.balance_factor, setup.routing.balance_factor, "{yaml}");
        assert!(!yaml.contains("cache_tokens"), "{yaml}");
    }

    #[test]
    fn kv_aware_gets_the_tokenizer_block_size_and_every_instances_sockets() {
        let setup = Kind::MultiTurn
            .setup(true, 1, std::path::Path::new("."))
            .unwrap();
        let (yaml, config) = parsed(&setup, Arm::KvAware);
        let e = &config.endpoints[0];
        assert_eq!(e.routing.strategy.as_str(), "kv_aware", "{yaml}");
        assert_eq!(e.routing.cache_tokens, setup.cache_tokens(), "{yaml}");
        assert_eq!(
            e.routing.balance_factor,
            Some(kvgate::config::DEFAULT_CACHE_AWARE_BALANCE_FACTOR)
        );
        assert!(yaml.contains("block_size: 16\n"), "{yaml}");
        assert_eq!(e.instances.len(), setup.instances);
        for (i, inst) in e.instances.iter().enumerate() {
            let events = format!("tcp://127.0.0.1:{}", 7000 + i);
            assert_eq!(inst.kv_events.as_deref(), Some(events.as_str()), "{yaml}");
            assert!(inst.kv_replay.is_some(), "{yaml}");
        }
    }
}
