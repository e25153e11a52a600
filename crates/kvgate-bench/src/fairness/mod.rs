//! `kvgate-loadbench fairness` (issue 22): does the gateway's fair queue keep
//! tenants apart when the fleet is saturated? Two simulated instances, three
//! tenants ([`tenants`]): `flood` sends 5× its fair share, `steady` and `vip`
//! (high priority) their share each, open loop. Four arms ([`arm`]), each on
//! a fresh fleet and a fresh gateway process ([`gateway`]):
//!
//! 1. `steady` alone, then `vip` alone: the unloaded fleet each would see;
//! 2. all three, the queue off (plain pass-through);
//! 3. all three, fair queueing on.
//!
//! Per tenant and arm: P50/P90 TTFT at the client (queueing in the gateway
//! included), tokens served a second, requests refused ([`stats`]); the
//! service gap between `flood` and `steady` while both are backlogged,
//! against VTC's bound, from the gateway's `/metrics` read every simulated
//! second ([`sampler`]); and the gateway's CPU time a request, queue on and
//! off. [`report`] writes `bench/results/fairness.md`.

pub mod arm;
pub mod client;
pub mod gateway;
pub mod replicas;
pub mod report;
pub mod results;
pub mod sampler;
mod sections;
pub mod stats;
pub mod tenants;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use kvgate_sim::SimConfig;

use crate::report::Context;
use arm::{ArmRun, Kind};
use gateway::QueueKnobs;
use tenants::{STEADY, Sizes, VIP};

/// The endpoint's name and the model every request names.
pub const MODEL: &str = "chat";

/// The command's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Directory for fairness.md (`fairness-quick.md` with `--quick`).
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// A tiny run (seconds), to check that it all works.
    #[arg(long)]
    pub quick: bool,
    /// Seed of the arrivals and request sizes.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Real seconds a simulated second (default 0.25; 0.1 with `--quick`).
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Simulated seconds of arrivals (default 120; 20 with `--quick`).
    #[arg(long)]
    pub duration: Option<f64>,
    /// The gateway binary (default: `kvgate` beside this one; build it with
    /// `cargo build --release -p kvgate`).
    #[arg(long)]
    pub kvgate: Option<PathBuf>,
    /// `queue.max_in_flight` (default: the instances' `max_num_seqs`, 256).
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// `queue.max_waiting` (default: the gateway's, 0).
    #[arg(long, default_value_t = 0)]
    pub max_waiting: u64,
    /// `queue.engine_poll_ms`, simulated (default: the gateway's, 250).
    #[arg(long, default_value_t = 250)]
    pub engine_poll_ms: u64,
    /// What `steady` and `vip` each send, in fair shares (default 1: their
    /// share; `flood` sends 5).
    #[arg(long, default_value_t = 1.0)]
    pub share: f64,
    /// Run the unloaded baselines with the queue on too (default: off).
    #[arg(long)]
    pub unloaded_queue: bool,
    /// Also write every arm's once-a-second samples here, as CSV.
    #[arg(long)]
    pub samples_csv: Option<PathBuf>,
    /// Gateway replicas (`1,2,4`): anything but `1` runs the flood with the
    /// queue on behind each count, every replica its own process sharing
    /// one Redis, each sent every n-th request, into `replicas-fairness.md`.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize])]
    pub replicas: Vec<usize>,
}

/// Everything an arm needs.
#[derive(Clone, Debug)]
pub struct Options {
    pub instances: usize,
    /// Each instance (the 70B / 4×H100 preset) and the time scale.
    pub sim: SimConfig,
    pub sizes: Sizes,
    /// Arrivals run over `[0, duration)`; the figures are taken over
    /// `[warmup, duration)`.
    pub duration: Duration,
    pub warmup: Duration,
    /// A request with no first token after this long is given up (simulated).
    pub ttft_cap: Duration,
    pub queue: QueueKnobs,
    pub kvgate: PathBuf,
    pub seed: u64,
    /// Each tenant's offered load in fair shares, in [`tenants::TENANTS`] order.
    pub shares: [f64; 3],
    /// Whether the unloaded baselines queue too.
    pub unloaded_queue: bool,
    /// Gateway replicas in front of the instances.
    pub replicas: usize,
}

impl Options {
    pub fn new(args: &Args) -> anyhow::Result<Self> {
        let time_scale = args
            .time_scale
            .unwrap_or(if args.quick { 0.1 } else { 0.25 });
        if !(time_scale.is_finite() && time_scale > 0.0) {
            anyhow::bail!("--time-scale must be a positive number");
        }
        let duration = args
            .duration
            .unwrap_or(if args.quick { 20.0 } else { 120.0 });
        if !(duration.is_finite() && duration >= 10.0) {
            anyhow::bail!("--duration must be at least 10 (simulated seconds)");
        }
        if !(args.share.is_finite() && args.share > 0.0) {
            anyhow::bail!("--share must be a positive number");
        }
        let mut shares = tenants::TENANTS.map(|t| t.shares);
        shares[STEADY] = args.share;
        shares[VIP] = args.share;
        let kvgate = match &args.kvgate {
            Some(p) => p.clone(),
            None => gateway::default_binary().context(
                "no kvgate binary beside this one: `cargo build --release -p kvgate`, or --kvgate PATH",
            )?,
        };
        let sim = SimConfig {
            time_scale,
            ..SimConfig::llama70b_h100_tp4()
        };
        let queue = QueueKnobs {
            // The engine's own batch bound: the gateway lets each instance
            // run a full batch and keeps the rest.
            max_in_flight: args.max_in_flight.unwrap_or(sim.max_running).max(1),
            max_waiting: args.max_waiting,
            max_kv_usage: 0.98,
            engine_poll: Duration::from_millis(args.engine_poll_ms.max(1)),
            max_length: 1024,
            max_wait: Duration::from_secs(30),
            input_weight: 1.0,
            output_weight: 2.0,
        };
        Ok(Self {
            instances: 2,
            sim,
            sizes: Sizes::CHAT,
            duration: Duration::from_secs_f64(duration),
            // A quarter of the run, and never less than the queue's longest
            // wait: by then the flood's first requests have timed out.
            warmup: Duration::from_secs_f64(
                (duration / 4.0)
                    .max(queue.max_wait.as_secs_f64())
                    .min(duration / 2.0),
            ),
            ttft_cap: Duration::from_secs(60),
            queue,
            kvgate,
            seed: args.seed,
            shares,
            unloaded_queue: args.unloaded_queue,
            replicas: 1,
        })
    }

    /// The fleet's capacity in requests a simulated second, estimated: every
    /// instance's prefill rate over a request's mean prompt and answer
    /// tokens (a saturated instance is compute-bound, and a decode token in
    /// a full batch costs about what a prompt token does).
    pub fn capacity_estimate(&self) -> f64 {
        let (prompt, output) = self.sizes.means();
        self.instances as f64 * self.sim.prefill_tokens_per_s / (prompt + output)
    }

    pub fn window(&self) -> stats::Window {
        stats::Window {
            from: self.warmup.as_secs_f64(),
            to: self.duration.as_secs_f64(),
        }
    }
}

/// The command: every arm, then the report.
pub async fn run(args: &Args, ctx: &Context) -> anyhow::Result<PathBuf> {
    let opts = Options::new(args)?;
    let capacity = opts.capacity_estimate();
    let fair_share = capacity / 3.0;
    // The source as the binaries were built from it, read before the arms run.
    let build = crate::host::build();
    let requests = arm::requests(&opts, fair_share);
    eprintln!(
        "fairness: capacity ≈ {capacity:.1} req/s, fair share {fair_share:.2} req/s, {} requests over {} s (time scale {})",
        requests.len(),
        opts.duration.as_secs_f64(),
        opts.sim.time_scale
    );
    if args.replicas != [1] {
        return replicas::run(args, ctx, &opts, &requests, (capacity, fair_share), build).await;
    }
    let mut runs: Vec<ArmRun> = Vec::new();
    for kind in [
        Kind::Alone(STEADY),
        Kind::Alone(VIP),
        Kind::FloodQueueOff,
        Kind::FloodQueueOn,
    ] {
        let run = arm::run(&opts, kind, &requests).await?;
        eprintln!("  {}", report::progress_line(&opts, &run));
        runs.push(run);
    }
    let results = results::Results {
        opts: &opts,
        capacity_estimate: capacity,
        fair_share,
        runs: &runs,
        build,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join(if args.quick {
        "fairness-quick.md"
    } else {
        "fairness.md"
    });
    std::fs::write(&path, report::markdown(ctx, &results))?;
    if let Some(csv) = &args.samples_csv {
        std::fs::write(csv, sections::samples_csv(&runs))?;
    }
    Ok(path)
}
