//! kvgate's routing-quality benchmark: a load generator that drives the real
//! gateway over HTTP in front of simulated vLLM instances (`kvgate-sim`), all in
//! one process on 127.0.0.1, and compares the routing strategies side by side.
//!
//! For each workload ([`workload::Kind`]) and each strategy it starts a fresh
//! fleet with cold caches and a fresh gateway ([`fleet`]), plays the workload's
//! sessions on the simulated clock ([`driver`]), streaming every answer, and
//! reports ([`run::RunResult`]):
//! - KV hit rate from the instances' own counters (cached ÷ prompt tokens), and
//!   against the reuse ceiling of the same requests on one infinite cache
//!   ([`ceiling`]) and, for Mooncake, the trace's published ceiling;
//! - P50/P90 time to the first SSE chunk as the client saw it, converted to
//!   simulated time (real ÷ `time_scale`, so it includes the gateway's and the
//!   loopback's real overheads, magnified by 1/`time_scale`);
//! - throughput in simulated time, each instance's share of requests, the
//!   gateway's routing decisions by outcome (overflow, fallback …) from its
//!   `/metrics` under an endpoint name unique to the run, and its routing time
//!   (the delta of the process-wide `kvgate_routing_decision_seconds` histogram).
//!
//! [`report`] writes the Markdown table and [`chart`] the SVG.
//!
//! [`matrix`] runs the same comparison over a matrix of load regimes
//! ([`regime`]: open or closed loop ([`closed`]), streaming or not, KV capacity
//! learned or unknown) and writes `matrix.md` with a verdict a cell.
//!
//! Chat sessions go over OpenAI chat or Anthropic Messages ([`regime::Api`],
//! [`conversation`]); [`agents`] runs the coding-agent workload under every
//! strategy over both and writes `agents.md`.
//!
//! [`fairness`] measures the gateway's fair queue between tenants on a
//! saturated fleet and writes `fairness.md`.

pub mod agents;
pub mod arm;
pub mod ceiling;
pub mod chart;
pub mod client;
pub mod closed;
pub mod conversation;
pub mod density;
pub mod driver;
pub mod fairness;
pub mod fleet;
pub mod gateway_config;
pub mod host;
pub mod kv_wait;
pub mod matrix;
pub mod prom;
pub mod readback;
pub mod records;
pub mod redis_proc;
pub mod regime;
pub mod report;
pub mod run;
pub mod tokenizer;
pub mod workload;

pub use arm::Arm;
pub use regime::{Api, Arrivals, Capacity, Regime};
pub use run::RunResult;
pub use workload::{Kind, Setup};

/// One workload under every arm.
#[derive(Clone, Debug)]
pub struct WorkloadResult {
    pub setup_id: String,
    pub description: String,
    pub requests: usize,
    pub time_scale: f64,
    pub routing: workload::Routing,
    /// Hit rate of the same requests on one infinite cache.
    pub ceiling: f64,
    /// The same in SmolLM2 tokens, when a `kv_aware` arm ran (its instances
    /// count those, the others 4-byte chunks).
    pub token_ceiling: Option<f64>,
    /// Gateway replicas, each sent every n-th request.
    pub gateways: usize,
    /// `kv_aware`'s instances' capacity and speed factor (`--kv-token-ratio`).
    pub kv_token_ratio: f64,
    /// The same for its prefill rate and step budget.
    pub kv_prefill_ratio: f64,
    /// The trace's published ceiling (Mooncake).
    pub trace_ceiling: Option<f64>,
    /// Each instance's KV capacity: blocks, tokens a block, and the factor
    /// (`--cache-scale`) applied to the workload's own size.
    pub cache_blocks: usize,
    pub block_size: usize,
    pub cache_scale: f64,
    /// The instances' `max_partial_prefills` (`None`: no limit).
    pub max_partial_prefills: Option<usize>,
    pub instances: usize,
    pub regime: Regime,
    /// Characters a token of the text sent (`--density`).
    pub density: density::Density,
    pub runs: Vec<RunResult>,
}

impl WorkloadResult {
    pub fn run(&self, arm: Arm) -> Option<&RunResult> {
        self.runs.iter().find(|r| r.arm == arm)
    }

    /// The ceiling `arm`'s hit rate is measured against, counted in the same
    /// tokens its instances count.
    pub fn ceiling_of(&self, arm: Arm) -> f64 {
        match self.token_ceiling {
            Some(c) if arm.tokenizing() => c,
            _ => self.ceiling,
        }
    }

    /// `run`'s hit rate as a fraction of its ceiling.
    pub fn of_ceiling(&self, run: &RunResult) -> f64 {
        run.hit_rate / self.ceiling_of(run.arm).max(1e-9)
    }

    /// Whether `--cache-scale` changed the workload's own cache size.
    pub fn is_cache_scaled(&self) -> bool {
        (self.cache_scale - 1.0).abs() > 1e-9
    }

    /// The workload's id, with ` (4× cache)` when its cache was scaled.
    pub fn title(&self) -> String {
        if self.is_cache_scaled() {
            format!("{} ({}× cache)", self.setup_id, self.cache_scale)
        } else {
            self.setup_id.clone()
        }
    }

    /// KV capacity of one instance, tokens.
    pub fn cache_tokens(&self) -> usize {
        self.cache_blocks.saturating_mul(self.block_size)
    }

    /// The workload's id, and its density when not the workloads' own 4
    /// (`multi-turn`, `multi-turn at 2 chars/token`).
    pub fn workload_label(&self) -> String {
        if self.density.is_english() {
            self.setup_id.clone()
        } else {
            format!("{} at {}", self.setup_id, self.density)
        }
    }
}

/// Run `setup` under each of `arms` in turn; `tag` keeps endpoint names
/// (and so metric labels) unique in this process. `progress` hears a line a run.
pub async fn bench(
    setup: &Setup,
    arms: &[Arm],
    tag: &str,
    progress: impl FnMut(&str),
) -> anyhow::Result<WorkloadResult> {
    bench_with(setup, arms, tag, true, progress).await
}

/// [`bench`], with the ceilings and the gateway's metrics measured or not
/// (`ceiling` then 0, no decisions, no routing time).
pub async fn bench_with(
    setup: &Setup,
    arms: &[Arm],
    tag: &str,
    ceilings: bool,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<WorkloadResult> {
    let mut runs = Vec::with_capacity(arms.len());
    let mut bodies = Vec::new();
    // `kv_aware`'s instances count the model's tokens where the others count
    // 4-byte chunks; unless a ratio was given (`--kv-token-ratio`, or a
    // recoded density's), they get as much more KV (over the whole prompts)
    // and prefill rate and step budget (over the text an infinite cache
    // still prefills) as the first arm's bodies measure, so that each arm's
    // engines hold and prefill the same text in the same time.
    let calibrate = (setup.kv_token_ratio - 1.0).abs() < 1e-9
        && arms.first().is_some_and(|a| !a.tokenizing())
        && arms.iter().any(|a| a.tokenizing());
    let mut kv_setup = setup.clone();
    let mut measured = !calibrate;
    for (i, &arm) in arms.iter().enumerate() {
        if arm.tokenizing() && !measured {
            let (held, prefilled) = ceiling::token_ratio(&bodies, tokenizer::shared()?).await?;
            kv_setup.kv_token_ratio = held;
            kv_setup.kv_prefill_ratio = Some(prefilled);
            measured = true;
        }
        let on = if arm.tokenizing() { &kv_setup } else { setup };
        let record = (ceilings || calibrate) && i == 0;
        let mut r = run::run(on, arm, tag, record, ceilings).await?;
        progress(&format!(
            "{:<22} {:<27} hit {:>5.1}%  p50 {:>6.0} ms  p90 {:>6.0} ms  (engine {:>6.0} / {:>6.0} ms)  moved {}  failed {}  wall {:.1} s",
            setup.id,
            arm.label(),
            100.0 * r.hit_rate,
            1000.0 * r.ttft_p50,
            1000.0 * r.ttft_p90,
            1000.0 * r.engine_ttft_p50.unwrap_or(0.0),
            1000.0 * r.engine_ttft_p90.unwrap_or(0.0),
            r.moved(),
            r.failed,
            r.wall.as_secs_f64()
        ));
        if i == 0 {
            bodies = std::mem::take(&mut r.bodies);
        }
        runs.push(r);
    }
    let ceiling = if ceilings {
        ceiling::ceiling(&bodies, None).await?
    } else {
        0.0
    };
    let token_ceiling = if ceilings && arms.iter().any(|a| a.tokenizing()) {
        Some(ceiling::ceiling(&bodies, Some(tokenizer::shared()?)).await?)
    } else {
        None
    };
    Ok(WorkloadResult {
        setup_id: setup.id.clone(),
        description: setup.description.clone(),
        requests: setup.requests(),
        time_scale: setup.sim.time_scale,
        routing: setup.routing,
        ceiling,
        token_ceiling,
        gateways: setup.gateways.max(1),
        kv_token_ratio: kv_setup.kv_token_ratio,
        kv_prefill_ratio: kv_setup.kv_prefill_ratio.unwrap_or(kv_setup.kv_token_ratio),
        trace_ceiling: setup.trace_ceiling,
        cache_blocks: setup.sim.cache_blocks,
        block_size: setup.sim.block_size,
        cache_scale: setup.cache_scale,
        max_partial_prefills: setup.sim.max_partial_prefills,
        instances: setup.instances,
        regime: setup.regime,
        density: setup.density,
        runs,
    })
}
