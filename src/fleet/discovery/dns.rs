//! One DNS lookup: every A and AAAA record of a name, asked afresh each
//! time (no cache: the point is to see pods come and go), sorted so equal
//! answers compare equal.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

/// A resolver for one `dns_server` (or the system's when `None`).
pub fn resolver(server: Option<SocketAddr>) -> Result<TokioResolver, String> {
    let mut builder = match server {
        Some(addr) => {
            let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
            for c in &mut ns.connections {
                c.port = addr.port();
            }
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![ns]),
                TokioRuntimeProvider::default(),
            )
        }
        None => TokioResolver::builder_tokio().map_err(|e| e.to_string())?,
    };
    let opts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.cache_size = 0;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
    builder.build().map_err(|e| e.to_string())
}

/// Every address `host` resolves to, with `port`. An IP literal resolves to itself.
pub async fn lookup(
    resolver: &TokioResolver,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    // A trailing dot: the name is absolute, so no search domain is tried first.
    let name = if host.ends_with('.') {
        host.to_owned()
    } else {
        format!("{host}.")
    };
    let answer = resolver.lookup_ip(name).await.map_err(|e| e.to_string())?;
    let mut addrs: Vec<SocketAddr> = answer.iter().map(|ip| SocketAddr::new(ip, port)).collect();
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}
