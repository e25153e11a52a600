//! `kvgate simulate`: an offline what-if. Replays a Mooncake trace through the
//! gateway's own routing policies ([`kvgate_routing`]) onto a fleet of simulated
//! instances built on kvgate-sim's KV cache and scheduling rules, in virtual
//! time and without HTTP, sweeping `prefix_aware`'s `prefix_length` ×
//! `concurrency_threshold` and `longest_prefix`'s `block_chars` × assumed
//! `cache_tokens` (plus the prompt-blind strategies for comparison), and
//! recommending a setting of each.
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
//! - [`chain`]: trace ids → the gateway's block chain of `block_chars`
//!   characters, for `longest_prefix`'s per-instance index.
//! - [`instance`]: one instance's cache and timing in virtual time, and the
//!   gateway's queued-prefill charges on it.
//! - [`engine`]: the discrete-event loop that routes each arrival, keeping the
//!   gateway's block index per instance for cache-aware strategies.
//! - [`sweep`]: the grid, run in parallel.
//! - [`recommend`]: the rule that picks the settings to recommend.
//! - [`report`]: table or JSON.

pub mod chain;
pub mod engine;
pub mod instance;
pub mod recommend;
pub mod report;
pub mod sweep;
pub mod trace;
pub mod workload;

use std::path::PathBuf;
use std::time::Instant;

use kvgate_sim::SimConfig;

use kvgate_routing::{Strategy, defaults};

use instance::Timing;
use recommend::recommend;
use report::{Report, Row, TraceSummary};
use sweep::{Axes, Fleet, grid};
use workload::Workload;

/// The config's defaults for `longest_prefix` ([`kvgate_routing::defaults`]):
/// the threshold only guards an instance (vLLM's `max_num_seqs`), and a prompt
/// indexes at most 1,024 blocks.
const DEFAULT_CACHE_AWARE_THRESHOLD: usize = defaults::DEFAULT_CACHE_AWARE_THRESHOLD as usize;
const DEFAULT_MAX_PROMPT_BLOCKS: usize = defaults::DEFAULT_MAX_PROMPT_BLOCKS as usize;

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
    /// Strategies to run; all but prefix_aware and longest_prefix run once.
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy,
          default_value = "prefix_aware,longest_prefix,random,round_robin,least_outstanding_requests")]
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
    /// longest_prefix's settings, last so that their help heading is theirs
    /// alone (boxed: they would make `kvgate`'s command enum lopsided).
    #[command(flatten)]
    pub longest: Box<LongestArgs>,
}

/// `kvgate simulate` options for `longest_prefix`.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "longest_prefix")]
pub struct LongestArgs {
    /// `block_chars` values (characters per index block) to sweep for longest_prefix.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024")]
    pub block_chars: Vec<usize>,
    /// KV cache per instance the gateway assumes for longest_prefix's index
    /// (`cache_tokens`), as multiples of the fleet's real cache, to sweep.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,2")]
    pub cache_scales: Vec<f64>,
    /// The same in tokens (e.g. 192000,384000); replaces --cache-scales.
    #[arg(long, value_delimiter = ',')]
    pub cache_tokens: Option<Vec<usize>>,
    /// `concurrency_threshold` for longest_prefix (the config's default for it).
    #[arg(long, default_value_t = DEFAULT_CACHE_AWARE_THRESHOLD)]
    pub longest_threshold: usize,
    /// `max_prompt_blocks` for longest_prefix: most index blocks per prompt.
    #[arg(long, default_value_t = DEFAULT_MAX_PROMPT_BLOCKS)]
    pub max_prompt_blocks: usize,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    if Strategy::parse(s) == Some(Strategy::KvAware) {
        // Offline there are no engines to publish events: the load benchmark
        // (crates/kvgate-bench) measures kv_aware against the simulated fleet.
        return Err("kv_aware routes on live KV events; simulate it with kvgate-loadbench (crates/kvgate-bench)".to_owned());
    }
    Strategy::parse(s).ok_or_else(|| {
        format!(
            "unknown strategy {s:?} (prefix_aware, longest_prefix, random, round_robin, least_outstanding_requests)"
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
    anyhow::ensure!(
        args.longest
            .block_chars
            .iter()
            .all(|b| (16..=65536).contains(b)),
        "--block-chars must be between 16 and 65536, as in config"
    );
    anyhow::ensure!(
        args.longest.max_prompt_blocks > 0,
        "--max-prompt-blocks must be at least 1"
    );
    let timing = timing(args)?;
    let cache_tokens =
        assumed_cache_tokens(&args.longest, timing.cache_blocks * timing.block_size)?;
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
        max_prompt_blocks: args.longest.max_prompt_blocks,
    };
    let axes = Axes {
        prefix_lengths: args.prefix_lengths.clone(),
        thresholds: args.thresholds.clone(),
        block_chars: args.longest.block_chars.clone(),
        cache_tokens,
        longest_threshold: args.longest.longest_threshold,
    };
    let settings = grid(&args.strategies, &axes);
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

/// The gateway's assumed cache sizes: `--cache-tokens`, or `--cache-scales`
/// times the fleet's `real` tokens.
fn assumed_cache_tokens(args: &LongestArgs, real: usize) -> anyhow::Result<Vec<usize>> {
    let tokens = match &args.cache_tokens {
        Some(t) => t.clone(),
        None => {
            anyhow::ensure!(
                args.cache_scales.iter().all(|s| s.is_finite() && *s > 0.0),
                "--cache-scales must be positive numbers"
            );
            args.cache_scales
                .iter()
                .map(|s| (s * real as f64).round() as usize)
                .collect()
        }
    };
    anyhow::ensure!(
        tokens.iter().all(|&t| t >= 1024),
        "--cache-tokens must be at least 1024, as in config"
    );
    Ok(tokens)
}

fn of_ceiling(hit_rate: f64, ceiling: f64) -> f64 {
    if ceiling > 0.0 {
        hit_rate / ceiling
    } else {
        0.0
    }
}
