//! `endpoints[].discovery`: where an endpoint finds instances beyond its
//! static list (DNS records, or a Service's EndpointSlices), validated, and
//! how a discovered pod becomes an [`InstanceConfig`] with the endpoint's
//! defaults.

use std::net::SocketAddr;
use std::time::Duration;

use super::raw::{RawDiscovery, RawKubernetes, RawPort};
use super::{ConfigError, InstanceConfig, RoutingConfig};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    pub source: Source,
    pub interval: Duration,
    pub scheme: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Every A/AAAA record of `host` is an instance on `port`.
    Dns {
        host: String,
        port: u16,
        server: Option<SocketAddr>,
    },
    /// Every ready endpoint of the Service's EndpointSlices.
    Kubernetes {
        namespace: String,
        service: String,
        port: Port,
        api_server: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Port {
    Number(u16),
    Name(String),
}

impl DiscoveryConfig {
    /// What an answer is keyed by: the same spec finds the same instances.
    pub fn target(&self) -> String {
        match &self.source {
            Source::Dns { host, port, .. } => format!("{host}:{port}"),
            Source::Kubernetes {
                namespace,
                service,
                port,
                ..
            } => {
                let port = match port {
                    Port::Number(n) => n.to_string(),
                    Port::Name(s) => s.clone(),
                };
                format!("kubernetes:{namespace}/{service}:{port}")
            }
        }
    }
}

pub fn validate(at: &str, raw: RawDiscovery) -> Result<DiscoveryConfig, ConfigError> {
    let f = |name: &str| format!("{at}.{name}");
    let scheme = match raw.scheme.as_deref() {
        None | Some("http") => "http",
        Some("https") => "https",
        Some(other) => {
            return Err(ConfigError::new(
                f("scheme"),
                format!("{other:?}: http or https"),
            ));
        }
    };
    let interval = raw.interval_ms.unwrap_or(5000);
    if !(100..=3_600_000).contains(&interval) {
        return Err(ConfigError::new(
            f("interval_ms"),
            "must be between 100 and 3600000",
        ));
    }
    let interval = Duration::from_millis(interval);
    let source = match (raw.dns, raw.kubernetes) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                f("kubernetes"),
                "one source per endpoint: dns or kubernetes",
            ));
        }
        (None, Some(k)) => {
            if raw.dns_server.is_some() {
                return Err(ConfigError::new(
                    f("dns_server"),
                    "only dns discovery uses a DNS server",
                ));
            }
            kubernetes(&f("kubernetes"), k)?
        }
        (Some(dns), None) => dns_source(at, &dns, raw.dns_server)?,
        (None, None) => {
            return Err(ConfigError::new(
                f("dns"),
                "required: \"host:port\" (a headless Service's name and the engine's port), or kubernetes: { namespace, service, port }",
            ));
        }
    };
    Ok(DiscoveryConfig {
        source,
        interval,
        scheme,
    })
}

fn kubernetes(at: &str, raw: RawKubernetes) -> Result<Source, ConfigError> {
    let f = |name: &str| format!("{at}.{name}");
    // DNS-1123 labels: what Kubernetes accepts for namespaces and Services.
    let label = |name: &str, v: Option<String>| -> Result<String, ConfigError> {
        let v = v.ok_or_else(|| ConfigError::new(f(name), "required"))?;
        let ok = !v.is_empty()
            && v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !v.starts_with('-')
            && !v.ends_with('-');
        if ok {
            Ok(v)
        } else {
            Err(ConfigError::new(
                f(name),
                format!("{v:?} is not a Kubernetes name (lowercase letters, digits, '-')"),
            ))
        }
    };
    let namespace = label("namespace", raw.namespace)?;
    let service = label("service", raw.service)?;
    let port = match raw.port {
        Some(RawPort::Number(n)) if n > 0 => Port::Number(n),
        Some(RawPort::Name(s)) if !s.is_empty() => Port::Name(s),
        _ => {
            return Err(ConfigError::new(
                f("port"),
                "required: the engine's port number, or the name of the Service's port",
            ));
        }
    };
    let api_server = match raw.api_server {
        None => None,
        Some(u) if reqwest::Url::parse(&u).is_ok_and(|u| u.host_str().is_some()) => Some(u),
        Some(u) => {
            return Err(ConfigError::new(
                f("api_server"),
                format!("{u:?} is not a URL"),
            ));
        }
    };
    Ok(Source::Kubernetes {
        namespace,
        service,
        port,
        api_server,
    })
}

fn dns_source(at: &str, dns: &str, dns_server: Option<String>) -> Result<Source, ConfigError> {
    let f = |name: &str| format!("{at}.{name}");
    let (host, port) = dns
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok().filter(|&p| p > 0)?)))
        .filter(|(h, _)| !h.is_empty() && !h.contains('/') && !h.contains(' '))
        .ok_or_else(|| {
            ConfigError::new(
                f("dns"),
                format!("{dns:?} is not \"host:port\" (e.g. \"vllm-headless.serving.svc.cluster.local:8000\")"),
            )
        })?;
    let server = match dns_server {
        None => None,
        Some(s) => Some(
            s.parse::<SocketAddr>()
                .or_else(|_| {
                    s.parse::<std::net::IpAddr>()
                        .map(|ip| SocketAddr::new(ip, 53))
                })
                .map_err(|_| {
                    ConfigError::new(
                        f("dns_server"),
                        format!("{s:?} is not an IP address with an optional port"),
                    )
                })?,
        ),
    };
    Ok(Source::Dns {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port,
        server,
    })
}

/// The instance a discovered pod stands for: `id` is what stays the same
/// while the pod lives (its name where Kubernetes gives one, else its
/// address), its defaults the endpoint's.
pub fn instance(
    discovery: &DiscoveryConfig,
    routing: &RoutingConfig,
    id: &str,
    addr: SocketAddr,
) -> InstanceConfig {
    let url = format!("{}://{addr}", discovery.scheme);
    let mut ic = InstanceConfig {
        id: id.to_owned(),
        url,
        cache_tokens: routing.cache_tokens,
        learn_cache_tokens: !routing.cache_tokens_configured,
        kv_events: None,
        kv_replay: None,
        discovered: true,
    };
    // Sockets come from kv_events_port / kv_replay_port only: no per-instance
    // keys exist for an address nobody wrote down, so this cannot fail.
    let _ = super::kv_aware::instance_sockets("", &mut ic, None, None, routing.kv.as_ref());
    ic
}
