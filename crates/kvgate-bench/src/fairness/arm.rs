//! One arm: a fresh fleet of simulated instances (in this process), a fresh
//! gateway process in front of them (or `--replicas` of them sharing a fresh
//! Redis, each sent every n-th request), the arm's tenants' arrivals played on
//! the simulated clock, the samples taken meanwhile, and the gateway's CPU
//! time over the run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::{SimConfig, SimHandle, spawn};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Options;
use super::client::{self, Outcome};
use super::gateway::{self, GatewayProc};
use super::sampler::{self, Sample};
use super::tenants::{self, Request, TENANTS};

/// Which tenants send and whether the gateway queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One well-behaved tenant alone (no flood), the queue off: its
    /// unloaded-fleet baseline.
    Alone(usize),
    /// All three, the queue off: plain pass-through.
    FloodQueueOff,
    /// All three, fair queueing on.
    FloodQueueOn,
}

impl Kind {
    pub fn label(self) -> String {
        match self {
            Kind::Alone(t) => format!("unloaded ({} alone)", TENANTS[t].name),
            Kind::FloodQueueOff => "flood, queue off".to_owned(),
            Kind::FloodQueueOn => "flood, queue on".to_owned(),
        }
    }

    pub fn sends(self, tenant: usize) -> bool {
        match self {
            Kind::Alone(t) => t == tenant,
            _ => true,
        }
    }

    /// Whether the gateway queues in this arm.
    pub fn queues(self, opts: &Options) -> bool {
        match self {
            Kind::Alone(_) => opts.unloaded_queue,
            Kind::FloodQueueOff => false,
            Kind::FloodQueueOn => true,
        }
    }
}

/// One request as the client saw it.
#[derive(Clone, Debug)]
pub struct Record {
    pub tenant: usize,
    /// Simulated seconds since the start at which it was sent.
    pub sent: f64,
    pub outcome: Outcome,
}

/// What one arm measured.
#[derive(Clone, Debug)]
pub struct ArmRun {
    pub kind: Kind,
    pub records: Vec<Record>,
    pub samples: Vec<Sample>,
    /// Gateway CPU seconds from the first arrival to the last answer.
    pub gateway_cpu: f64,
    pub wall: Duration,
    /// The gateway's log lines at WARN and above (anything unexpected).
    pub warnings: Vec<String>,
}

/// Run `kind` with `requests` (every tenant's; the arm picks its own).
pub async fn run(opts: &Options, kind: Kind, requests: &[Request]) -> anyhow::Result<ArmRun> {
    let ts = opts.sim.time_scale;
    let mut sims = Vec::with_capacity(opts.instances);
    for i in 0..opts.instances {
        let cfg = SimConfig {
            name: format!("sim-{i}"),
            ..opts.sim.clone()
        };
        sims.push(spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await?);
    }
    let urls: Vec<String> = sims.iter().map(SimHandle::url).collect();
    let queue = kind.queues(opts).then_some(&opts.queue);
    let name = match kind {
        Kind::Alone(t) => TENANTS[t].name,
        Kind::FloodQueueOff => "off",
        Kind::FloodQueueOn => "on",
    };
    // Several replicas share their fair service through one Redis; a lone
    // gateway runs as it always has, on nothing shared.
    let redis = if opts.replicas > 1 {
        Some(crate::redis_proc::RedisProc::start().await?)
    } else {
        None
    };
    let mut gateways = Vec::with_capacity(opts.replicas.max(1));
    for r in 0..opts.replicas.max(1) {
        let port = gateway::free_port()?;
        let mut yaml = gateway::yaml(port, super::MODEL, &urls, queue, ts);
        if let Some(redis) = &redis {
            let sync = crate::fleet::SHARING.0;
            yaml.push_str(&format!(
                "cluster:\n  redis: \"{}\"\n  timeout_ms: 500\n  sync_ms: {sync}\n",
                redis.url()
            ));
        }
        let name = format!("{name}-r{r}");
        gateways.push(GatewayProc::start(&opts.kvgate, &yaml, port, &name).await?);
    }
    let gateways = Arc::new(gateways);
    let clients = TENANTS
        .iter()
        .map(|t| client::for_tenant(&t.key()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sims = Arc::new(sims);
    let urls: Vec<String> = gateways
        .iter()
        .map(|g| format!("{}/v1/chat/completions", g.url))
        .collect();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    let t0 = Instant::now() + Duration::from_millis(200);
    let cpu = {
        let gateways = Arc::clone(&gateways);
        move || gateways.iter().map(GatewayProc::cpu_seconds).sum::<f64>()
    };
    let cpu_start = cpu();
    let sampler = {
        tokio::spawn(sampler::run(
            gateways.iter().map(|g| g.url.clone()).collect(),
            cpu.clone(),
            Arc::clone(&sims),
            t0,
            ts,
            stop_rx,
        ))
    };
    let mut tasks = JoinSet::new();
    // Each request to the next replica, as a balancer without affinity sends them.
    for (n, r) in requests.iter().filter(|r| kind.sends(r.tenant)).enumerate() {
        let client = clients[r.tenant].clone();
        let url = urls[n % urls.len()].clone();
        let r = r.clone();
        let cap = Duration::from_secs_f64(opts.ttft_cap.as_secs_f64() * ts);
        tasks.spawn(async move {
            tokio::time::sleep_until(t0 + Duration::from_secs_f64(r.at.as_secs_f64() * ts)).await;
            let body = tenants::body(super::MODEL, &r);
            let sent = t0.elapsed().as_secs_f64() / ts;
            let outcome = client::send(&client, &url, body, cap).await;
            Record {
                tenant: r.tenant,
                sent,
                outcome,
            }
        });
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        records.push(done?);
    }
    let wall = t0.elapsed();
    let gateway_cpu = cpu() - cpu_start;
    let _ = stop_tx.send(true);
    let samples = sampler.await.unwrap_or_default();
    let warnings = gateways
        .iter()
        .flat_map(|g| {
            std::fs::read_to_string(&g.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    drop(gateways);
    drop(redis);
    if let Ok(sims) = Arc::try_unwrap(sims) {
        for sim in sims {
            let _ = sim.shutdown().await;
        }
    }
    records.sort_by(|a, b| a.sent.total_cmp(&b.sent));
    Ok(ArmRun {
        kind,
        records,
        samples,
        gateway_cpu,
        wall,
        warnings,
    })
}

/// Every tenant's requests, in arrival order: each at its shares
/// ([`Options::shares`]) of `fair_share` requests a simulated second.
pub fn requests(opts: &Options, fair_share: f64) -> Vec<Request> {
    let mut all: Vec<Request> = (0..TENANTS.len())
        .flat_map(|i| {
            let rate = fair_share * opts.shares[i];
            tenants::arrivals(i, rate, opts.duration, &opts.sizes, opts.seed)
        })
        .collect();
    all.sort_by_key(|r| (r.at, r.tenant));
    all
}
