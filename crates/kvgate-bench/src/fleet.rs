//! A fresh fleet for one run: simulated instances with cold caches and the real
//! gateway in front of them, each on its own 127.0.0.1 port, in this process.

use std::net::SocketAddr;

use kvgate_sim::{SimConfig, SimHandle, SimStats, spawn};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::arm::Arm;
use crate::workload::Setup;

/// Simulated instances and the gateway routing to them.
pub struct Fleet {
    pub sims: Vec<SimHandle>,
    /// `http://127.0.0.1:PORT` of the gateway.
    pub gateway: String,
    /// The endpoint (and model) name, unique to this run so its metrics are its own.
    pub endpoint: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Fleet {
    /// Spawn `setup.instances` simulators and a gateway configured for `arm`.
    pub async fn start(setup: &Setup, arm: Arm, endpoint: &str) -> anyhow::Result<Self> {
        let mut sims = Vec::with_capacity(setup.instances);
        for i in 0..setup.instances {
            let cfg = SimConfig {
                name: format!("sim-{i}"),
                ..setup.sim.clone()
            };
            sims.push(spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await?);
        }
        let instances: Vec<(String, String)> = sims
            .iter()
            .map(|s| (s.url(), s.server.config().name.clone()))
            .collect();
        let yaml = config_yaml(setup, arm, endpoint, &instances);
        let config = kvgate::Config::from_yaml(&yaml)
            .map_err(|e| anyhow::anyhow!("gateway config: {e}\n{yaml}"))?;
        let state = kvgate::build_state(config)?;
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let gateway = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(kvgate::serve(listener, state, async {
            let _ = stopped.await;
        }));
        Ok(Self {
            sims,
            gateway,
            endpoint: endpoint.to_owned(),
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Each instance's counters, in instance order.
    pub fn stats(&self) -> Vec<SimStats> {
        self.sims.iter().map(|s| s.server.stats()).collect()
    }

    /// Stop the gateway and the instances.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        for sim in self.sims.drain(..) {
            let _ = sim.shutdown().await;
        }
    }
}

/// The gateway's YAML: one endpoint serving model `endpoint`, `(url, id)`
/// instances (ids `sim-0` … in fleet order), health probes left at their defaults.
fn config_yaml(setup: &Setup, arm: Arm, endpoint: &str, instances: &[(String, String)]) -> String {
    let instances: String = instances
        .iter()
        .map(|(url, id)| format!("      - url: \"{url}\"\n        id: \"{id}\"\n"))
        .collect();
    let r = arm.routing(setup.routing);
    let balance = r
        .balance_factor
        .map(|c| format!("      balance_factor: {c}\n"))
        .unwrap_or_default();
    // `longest_prefix` runs on its own defaults (threshold, balance factor)
    // but for its index, sized to what the instances really hold.
    let (threshold, cache) = if arm == Arm::LongestPrefix {
        (
            String::new(),
            format!("      cache_tokens: {}\n", setup.cache_tokens()),
        )
    } else {
        (
            format!("      concurrency_threshold: {}\n", r.concurrency_threshold),
            String::new(),
        )
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
{threshold}{balance}{cache}"#,
        strategy = arm.strategy().as_str(),
        prefix_length = r.prefix_length,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Kind;

    fn parsed(setup: &Setup, arm: Arm) -> (String, kvgate::Config) {
        let instances: Vec<(String, String)> = (0..setup.instances)
            .map(|i| (format!("http://127.0.0.1:{}", 9000 + i), format!("sim-{i}")))
            .collect();
        let yaml = config_yaml(setup, arm, "e", &instances);
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
}
