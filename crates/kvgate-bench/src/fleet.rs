//! A fresh fleet for one run: simulated instances with cold caches and one or
//! more replicas of the real gateway in front of them (same config), each on
//! its own 127.0.0.1 port: `kvgate::serve` tasks in this process, or with
//! [`Setup::separate_processes`] `kvgate serve` processes sharing a fresh
//! `redis-server` (`cluster`, see [`SHARING`]).
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

/// How often replicas as processes share state and read the engines, in
/// real milliseconds: `cluster.sync_ms` and `queue.engine_poll_ms`.
pub const SHARING: (u64, u64) = (20, 50);

/// One gateway replica, in this process or its own.
enum Replica {
    Task(Gateway),
    Process(crate::fairness::gateway::GatewayProc),
}

impl Replica {
    fn url(&self) -> &str {
        match self {
            Self::Task(g) => &g.url,
            Self::Process(p) => &p.url,
        }
    }
}

/// One gateway replica in this process.
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
    replicas: Vec<Replica>,
    /// The Redis replicas as processes share (dropped last).
    pub redis: Option<crate::redis_proc::RedisProc>,
}

impl Fleet {
    /// Spawn `setup.instances` simulators and `setup.gateways` gateways
    /// configured for `arm`. Under `kv_aware` the instances tokenize with
    /// SmolLM2's tokenizer and publish KV events, and this returns once every
    /// gateway has heard every instance (see [`crate::kv_wait`]).
    pub async fn start(setup: &Setup, arm: Arm, endpoint: &str) -> anyhow::Result<Self> {
        let tokenizer = if arm.tokenizing() {
            Some(crate::tokenizer::shared()?)
        } else {
            None
        };
        let kv_events = arm.uses_events().then(KvEventsConfig::default);
        let base = if arm.tokenizing() {
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
        let n = setup.gateways.max(1);
        let mut replicas = Vec::with_capacity(n);
        let redis = if setup.separate_processes {
            let redis = crate::redis_proc::RedisProc::start().await?;
            let bin = crate::fairness::gateway::default_binary().ok_or_else(|| {
                anyhow::anyhow!("replicas as processes need the kvgate binary beside this one (cargo build --release --bin kvgate)")
            })?;
            for r in 0..n {
                let port = std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port();
                let yaml = shared_yaml(&yaml, port, &redis.url());
                let name = format!("{endpoint}-{r}");
                let p =
                    crate::fairness::gateway::GatewayProc::start(&bin, &yaml, port, &name).await?;
                replicas.push(Replica::Process(p));
            }
            Some(redis)
        } else {
            for _ in 0..n {
                replicas.push(Replica::Task(Gateway::start(&yaml).await?));
            }
            None
        };
        let fleet = Self {
            gateways: replicas.iter().map(|g| g.url().to_owned()).collect(),
            sims,
            endpoint: endpoint.to_owned(),
            replicas,
            redis,
        };
        if arm.uses_events() {
            if setup.separate_processes {
                crate::kv_wait::until_heard_over_http(&fleet.gateways, endpoint, &fleet.sims)
                    .await?;
            } else {
                let states: Vec<Arc<AppState>> = fleet
                    .replicas
                    .iter()
                    .filter_map(|g| match g {
                        Replica::Task(g) => Some(Arc::clone(&g.state)),
                        Replica::Process(_) => None,
                    })
                    .collect();
                crate::kv_wait::until_heard(&states, endpoint, &fleet.sims).await?;
            }
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
        let learned = |g: &Replica| {
            // A process learns it on its own; its first probes come at start.
            let Replica::Task(g) = g else { return true };
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

    /// Bytes of canonical prompt a token, as the first in-process gateway
    /// learned it from the engines' `usage` (`kvgate_routing::units`: it
    /// calls them characters and counts UTF-8 bytes); `None` before it has
    /// [`kvgate_routing::units::MIN_ANSWERS`] samples, or with the gateways
    /// in processes of their own.
    pub fn learned_bytes_per_token(&self) -> Option<f64> {
        self.replicas.iter().find_map(|g| {
            let Replica::Task(g) = g else { return None };
            let rt = g.state.runtime.load_full();
            let learned = rt.endpoint(&self.endpoint)?.density.learned()?;
            (learned > 0.0).then(|| 1.0 / learned)
        })
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
            if let Replica::Task(g) = g {
                g.stop().await;
            }
        }
        // Processes are killed as they drop.
        self.replicas.clear();
        for sim in self.sims.drain(..) {
            let _ = sim.shutdown().await;
        }
    }
}

/// The run's YAML for a replica as a process: listening on `port`, sharing
/// through `redis` every [`SHARING`] ms and reading the engines as often.
fn shared_yaml(yaml: &str, port: u16, redis: &str) -> String {
    let (sync, poll) = SHARING;
    let yaml = yaml.replacen(
        "listen: \"127.0.0.1:0\"",
        &format!("listen: \"127.0.0.1:{port}\""),
        1,
    );
    format!(
        "{yaml}cluster:\n  redis: \"{redis}\"\n  timeout_ms: 500\n  sync_ms: {sync}\nqueue:\n  engine_poll_ms: {poll}\n"
    )
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
