//! A fresh fleet for one run: simulated instances with cold caches and one or
//! more replicas of the real gateway in front of them (same config, each its
//! own `kvgate::serve`), each on its own 127.0.0.1 port, in this process.
//! Under [`Capacity::Unknown`] the instances export no `vllm:cache_config_info`;
//! under [`Capacity::Learned`] a cache-aware run starts once every gateway has
//! learned every instance's capacity from it.

use std::net::SocketAddr;
use std::sync::Arc;

use kvgate::AppState;
use kvgate_sim::{KvEventsConfig, Latencies, SimConfig, SimHandle, SimStats, spawn};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::arm::Arm;
use crate::gateway_config::{self, InstanceSpec};
use crate::regime::Capacity;
use crate::workload::Setup;

/// One gateway replica.
struct Gateway {
    url: String,
    state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// Simulated instances and the gateways routing to them.
pub struct Fleet {
    pub sims: Vec<SimHandle>,
    /// `http://127.0.0.1:PORT` of each gateway replica, in start order.
    pub gateways: Vec<String>,
    /// The endpoint (and model) name, unique to this run so its metrics are its own.
    pub endpoint: String,
    replicas: Vec<Gateway>,
}

impl Fleet {
    /// Spawn `setup.instances` simulators and `setup.gateways` gateways
    /// configured for `arm`. Under `kv_aware` the instances tokenize with
    /// SmolLM2's tokenizer and publish KV events, and this returns once every
    /// gateway has heard every instance (see [`crate::kv_wait`]).
    pub async fn start(setup: &Setup, arm: Arm, endpoint: &str) -> anyhow::Result<Self> {
        let (tokenizer, kv_events) = if arm.uses_events() {
            (
                Some(crate::tokenizer::shared()?),
                Some(KvEventsConfig::default()),
            )
        } else {
            (None, None)
        };
        let base = if arm.uses_events() {
            setup.kv_sim()
        } else {
            setup.sim.clone()
        };
        let mut sims = Vec::with_capacity(setup.instances);
        for i in 0..setup.instances {
            let cfg = SimConfig {
                name: format!("sim-{i}"),
                tokenizer: tokenizer.clone(),
                kv_events: kv_events.clone(),
                export_cache_config_info: setup.regime.capacity != Capacity::Unknown,
                ..base.clone()
            };
            sims.push(spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await?);
        }
        let instances: Vec<InstanceSpec> = sims
            .iter()
            .map(|s| InstanceSpec {
                url: s.url(),
                id: s.server.config().name.clone(),
                kv: s.kv_events_endpoint().zip(s.kv_replay_endpoint()),
            })
            .collect();
        let yaml = gateway_config::yaml(setup, arm, endpoint, &instances);
        let mut replicas = Vec::with_capacity(setup.gateways.max(1));
        for _ in 0..setup.gateways.max(1) {
            replicas.push(Gateway::start(&yaml).await?);
        }
        let fleet = Self {
            gateways: replicas.iter().map(|g| g.url.clone()).collect(),
            sims,
            endpoint: endpoint.to_owned(),
            replicas,
        };
        if arm.uses_events() {
            let states: Vec<Arc<AppState>> = fleet
                .replicas
                .iter()
                .map(|g| Arc::clone(&g.state))
                .collect();
            crate::kv_wait::until_heard(&states, endpoint, &fleet.sims).await?;
        }
        if arm.cache_aware_defaults() && setup.regime.capacity == Capacity::Learned {
            fleet.until_learned().await;
        }
        Ok(fleet)
    }

    /// Until every gateway has learned every instance's KV capacity from its
    /// `/metrics` (at most 5 s; a gateway that learns nothing is reported and
    /// the run goes on, on its default).
    async fn until_learned(&self) {
        let learned = |g: &Gateway| {
            let rt = g.state.runtime.load_full();
            rt.endpoint(&self.endpoint).is_some_and(|e| {
                e.instances
                    .iter()
                    .all(|i| i.learned_cache_tokens().is_some())
            })
        };
        for _ in 0..500 {
            if self.replicas.iter().all(learned) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        eprintln!(
            "warning: {}: the gateway learned no KV capacity in 5 s",
            self.endpoint
        );
    }

    /// Each instance's per-request latencies so far, in instance order.
    pub fn latencies(&self) -> Vec<Latencies> {
        self.sims.iter().map(|s| s.server.latencies()).collect()
    }

    /// Each instance's counters, in instance order.
    pub fn stats(&self) -> Vec<SimStats> {
        self.sims.iter().map(|s| s.server.stats()).collect()
    }

    /// Stop the gateways and the instances.
    pub async fn shutdown(mut self) {
        for g in &mut self.replicas {
            g.stop().await;
        }
        for sim in self.sims.drain(..) {
            let _ = sim.shutdown().await;
        }
    }
}

impl Gateway {
    async fn start(yaml: &str) -> anyhow::Result<Self> {
        let config = kvgate::Config::from_yaml(yaml)
            .map_err(|e| anyhow::anyhow!("gateway config: {e}\n{yaml}"))?;
        let state = kvgate::build_state(config)?;
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(kvgate::serve(listener, Arc::clone(&state), async {
            let _ = stopped.await;
        }));
        Ok(Self {
            url,
            state,
            stop: Some(stop),
            task: Some(task),
        })
    }

    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}
