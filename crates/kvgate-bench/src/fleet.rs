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
        let yaml = config_yaml(setup, arm, endpoint, &sims);
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

/// The gateway's YAML: one endpoint serving model `endpoint`, instance ids
/// `sim-0` … in fleet order, health probes left at their defaults.
fn config_yaml(setup: &Setup, arm: Arm, endpoint: &str, sims: &[SimHandle]) -> String {
    let instances: String = sims
        .iter()
        .map(|s| {
            format!(
                "      - url: \"{}\"\n        id: \"{}\"\n",
                s.url(),
                s.server.config().name
            )
        })
        .collect();
    let r = arm.routing(setup.routing);
    let balance = r
        .balance_factor
        .map(|c| format!("      balance_factor: {c}\n"))
        .unwrap_or_default();
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
      concurrency_threshold: {threshold}
{balance}"#,
        strategy = arm.strategy().as_str(),
        prefix_length = r.prefix_length,
        threshold = r.concurrency_threshold,
    )
}
