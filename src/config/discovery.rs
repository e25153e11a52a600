//! `endpoints[].discovery`: where an endpoint finds instances beyond its
//! static list (DNS today), validated, and how a discovered address becomes
//! an [`InstanceConfig`] with the endpoint's defaults.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, InstanceConfig, RoutingConfig};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    /// `host:port`: every A/AAAA record of `host` is an instance on `port`.
    pub dns: Option<String>,
    /// A resolver to ask instead of the system's (`/etc/resolv.conf`).
    pub dns_server: Option<String>,
    pub interval_ms: Option<u64>,
    /// `http` (default) or `https`.
    pub scheme: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    pub host: String,
    pub port: u16,
    pub server: Option<SocketAddr>,
    pub interval: Duration,
    pub scheme: &'static str,
}

impl DiscoveryConfig {
    /// What an answer is keyed by: the same spec resolves the same way.
    pub fn target(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

pub fn validate(at: &str, raw: RawDiscovery) -> Result<DiscoveryConfig, ConfigError> {
    let f = |name: &str| format!("{at}.{name}");
    let Some(dns) = raw.dns else {
        return Err(ConfigError::new(
            f("dns"),
            "required: \"host:port\" (a headless Service's name and the engine's port)",
        ));
    };
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
    let server = match raw.dns_server {
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
    let interval = raw.interval_ms.unwrap_or(5000);
    if !(100..=3_600_000).contains(&interval) {
        return Err(ConfigError::new(
            f("interval_ms"),
            "must be between 100 and 3600000",
        ));
    }
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
    Ok(DiscoveryConfig {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port,
        server,
        interval: Duration::from_millis(interval),
        scheme,
    })
}

/// The instance a discovered address stands for: its id is the address
/// (what stays the same while the pod lives), its defaults the endpoint's.
pub fn instance(
    discovery: &DiscoveryConfig,
    routing: &RoutingConfig,
    addr: SocketAddr,
) -> InstanceConfig {
    let url = format!("{}://{addr}", discovery.scheme);
    let mut ic = InstanceConfig {
        id: addr.to_string(),
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
