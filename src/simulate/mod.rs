//! `kvgate simulate`: an offline what-if. Replays a Mooncake trace through the
//! gateway's own routing policies ([`crate::routing`]) onto a fleet of simulated
//! instances built on kvgate-sim's KV cache and scheduling rules, in virtual
//! time and without HTTP, sweeping `prefix_length` × `concurrency_threshold`
//! (plus the prompt-blind strategies for comparison) and recommending a setting.
//! SageMaker's advice is to tune by load testing in production; this answers
//! the question before production, in seconds.
//!
//! **Block size.** kvgate-sim (like vLLM) caches 16-token blocks. A Mooncake
//! trace only says which 512-token blocks are shared, so by default the cache
//! is simulated in 512-token blocks holding the same number of tokens: on both
//! traces this agrees with 16-token blocks within 0.5 points of hit rate and a
//! few percent of TTFT (bench/results/simulate-*.txt) and runs ~100× faster
//! (the cache's per-block work dominates). `--kv-block-tokens 16` checks it.
//!
//! - [`trace`]: the trace file and its infinite-cache ceiling.
//! - [`workload`]: trace ids → chained KV block hashes and routing keys
//!   (window of `prefix_length` characters at 4 characters a token).
//! - [`instance`]: one instance's cache and timing in virtual time.
//! - [`engine`]: the discrete-event loop that routes each arrival.
//! - [`sweep`]: the grid, run in parallel, and the recommendation rule.
//! - [`report`]: table or JSON.

pub mod engine;
pub mod instance;
pub mod report;
pub mod sweep;
pub mod trace;
pub mod workload;

use std::path::PathBuf;
use std::time::Instant;

use kvgate_sim::SimConfig;

use crate::routing::Strategy;

use instance::Timing;
use report::{Report, Row, TraceSummary};
use sweep::{Fleet, grid, recommend};
use workload::Workload;

/// `kvgate simulate` options.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Mooncake trace (JSON lines: timestamp ms, input_length, output_length, hash_ids).
    #[arg(long)]
    pub trace: PathBuf,
    /// Instances in the fleet.
    #[arg(long, default_value_t = 7)]
    pub instances: usize,
    /// KV cache per instance in 16-token blocks [default: kvgate-sim's preset,
    /// 24,000 = 384k tokens: Llama-3.1-70B BF16 on 4 × H100 80 GB].
    #[arg(long)]
    pub cache_blocks: Option<usize>,
    /// Tokens per simulated KV block: 512 is the trace's own resolution (it names
    /// no finer sharing); 16 is vLLM's and kvgate-sim's block, ~100x slower and
    /// within 0.5 points of hit rate on the Mooncake traces. The cache holds the
    /// same tokens either way.
    #[arg(long, default_value_t = 512)]
    pub kv_block_tokens: usize,
    /// `prefix_length` values (characters) to sweep for prefix_aware.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,2048,4096,8192,16384,32768,65536"
    )]
    pub prefix_lengths: Vec<usize>,
    /// `concurrency_threshold` values to sweep for prefix_aware.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub thresholds: Vec<usize>,
    /// Strategies to run; all but prefix_aware run once.
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy,
          default_value = "prefix_aware,random,round_robin,least_outstanding_requests")]
    pub strategies: Vec<Strategy>,
    /// Divide arrival times by this to load the fleet harder (2 = twice the rate).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Replay only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Bounded-load balance factor c for prefix_aware (none by default, as in config).
    #[arg(long)]
    pub balance_factor: Option<f64>,
    /// Ring points per instance.
    #[arg(long, default_value_t = 160)]
    pub virtual_nodes: usize,
    /// Uncached prompt tokens per second per instance [default: preset, 12,000].
    #[arg(long)]
    pub prefill_tokens_per_s: Option<f64>,
    /// Decode step in milliseconds [default: preset, 25].
    #[arg(long)]
    pub itl_ms: Option<f64>,
    /// Most sequences running per instance [default: preset, 256].
    #[arg(long)]
    pub max_running: Option<usize>,
    /// Recommend only settings whose busiest instance takes at most (1 + this) / instances.
    #[arg(long, default_value_t = 0.25)]
    pub balance_tolerance: f64,
    /// Threads for the sweep [default: available cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| {
        format!(
            "unknown strategy {s:?} (prefix_aware, random, round_robin, least_outstanding_requests)"
        )
    })
}

/// The fleet's timing: kvgate-sim's preset with the overrides given.
fn timing(args: &SimulateArgs) -> anyhow::Result<Timing> {
    let mut t = Timing::from_sim(&SimConfig::llama70b_h100_tp4());
    if let Some(b) = args.cache_blocks {
        anyhow::ensure!(b > 0, "--cache-blocks must be at least 1");
        t.cache_blocks = b;
    }
    anyhow::ensure!(
        args.kv_block_tokens > 0,
        "--kv-block-tokens must be at least 1"
    );
    // --cache-blocks counts vLLM's 16-token blocks whatever the simulated block size.
    let tokens = t.cache_blocks * t.block_size;
    t.block_size = args.kv_block_tokens;
    t.cache_blocks = (tokens / t.block_size).max(1);
    if let Some(r) = args.prefill_tokens_per_s {
        anyhow::ensure!(
            r.is_finite() && r > 0.0,
            "--prefill-tokens-per-s must be > 0"
        );
        t.prefill_tokens_per_s = r;
    }
    if let Some(ms) = args.itl_ms {
        anyhow::ensure!(ms.is_finite() && ms >= 0.0, "--itl-ms must be >= 0");
        t.inter_token_latency_s = ms / 1e3;
    }
    if let Some(m) = args.max_running {
        anyhow::ensure!(m > 0, "--max-running must be at least 1");
        t.max_running = m;
    }
    Ok(t)
}

/// Run the sweep; returns the report as text (or JSON with `--json`).
pub fn run(args: &SimulateArgs) -> anyhow::Result<String> {
    anyhow::ensure!(args.instances > 0, "--instances must be at least 1");
    anyhow::ensure!(
        args.speedup.is_finite() && args.speedup > 0.0,
        "--speedup must be a positive number"
    );
    anyhow::ensure!(
        args.prefix_lengths.iter().all(|&p| p > 0),
        "--prefix-lengths must be positive"
    );
    let timing = timing(args)?;
    let mut trace = trace::load(&args.trace)?;
    if let Some(n) = args.limit {
        trace.truncate(n.max(1));
    }
    let w = Workload::new(&trace, timing.block_size);
    let first = trace.first().map_or(0.0, |r| r.timestamp);
    let last = trace.last().map_or(0.0, |r| r.timestamp);
    let summary = TraceSummary {
        path: args.trace.display().to_string(),
        requests: trace.len(),
        duration_s: (last - first) / 1e3,
        ceiling_blocks: trace::block_ceiling(&trace),
        ceiling_tokens: w.token_ceiling(),
    };
    let fleet = Fleet {
        instances: args.instances,
        timing,
        speedup: args.speedup,
        virtual_nodes: args.virtual_nodes.max(1),
        balance_factor: args.balance_factor,
    };
    let settings = grid(&args.strategies, &args.prefix_lengths, &args.thresholds);
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let started = Instant::now();
    let results = sweep::sweep(&trace, &w, &settings, &fleet, threads)?;
    let elapsed_s = started.elapsed().as_secs_f64();
    let recommendation = recommend(&settings, &results, args.instances, args.balance_tolerance);
    let rows = settings
        .into_iter()
        .zip(results)
        .map(|(setting, stats)| Row {
            setting,
            of_ceiling: of_ceiling(stats.hit_rate, summary.ceiling_tokens),
            stats,
        })
        .collect();
    let report = Report {
        trace: summary,
        fleet,
        rows,
        recommendation,
        elapsed_s,
        threads: threads.max(1),
    };
    if args.json {
        Ok(serde_json::to_string_pretty(&report)? + "\n")
    } else {
        Ok(report::text(&report))
    }
}

fn of_ceiling(hit_rate: f64, ceiling: f64) -> f64 {
    if ceiling > 0.0 {
        hit_rate / ceiling
    } else {
        0.0
    }
}
