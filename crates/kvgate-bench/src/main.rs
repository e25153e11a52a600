//! `kvgate-loadbench`: run the routing benchmark and write `routing.md` and
//! `routing.svg` into `--out`, or with `--replicas` other than 1, `replicas.md`.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use kvgate_bench::report::{self, Context};
use kvgate_bench::{Arm, Kind, bench, chart};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WorkloadArg {
    All,
    LongContext,
    MultiTurn,
    Mooncake,
    MooncakeConversation,
    MooncakeSynthetic,
    SystemPrompts,
    HotDocument,
}

impl WorkloadArg {
    fn kinds(self) -> Vec<Kind> {
        match self {
            WorkloadArg::All => Kind::ALL.to_vec(),
            WorkloadArg::LongContext => vec![Kind::LongContext],
            WorkloadArg::MultiTurn => vec![Kind::MultiTurn],
            WorkloadArg::Mooncake => vec![Kind::MooncakeConversation, Kind::MooncakeSynthetic],
            WorkloadArg::MooncakeConversation => vec![Kind::MooncakeConversation],
            WorkloadArg::MooncakeSynthetic => vec![Kind::MooncakeSynthetic],
            WorkloadArg::SystemPrompts => vec![Kind::SystemPrompts],
            WorkloadArg::HotDocument => vec![Kind::HotDocument],
        }
    }
}

/// Compare kvgate's routing strategies on simulated vLLM instances, over HTTP.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Which workloads to run (repeatable).
    #[arg(long, value_enum, default_values_t = [WorkloadArg::All])]
    workload: Vec<WorkloadArg>,
    /// A tiny run (seconds), for CI and smoke tests.
    #[arg(long)]
    quick: bool,
    /// Directory for routing.md and routing.svg.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Directory holding the Mooncake traces.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces"))]
    traces: PathBuf,
    /// Seed of the generated workloads.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Override every workload's time scale (real seconds per simulated second).
    #[arg(long)]
    time_scale: Option<f64>,
    /// Override `prefix_aware`'s prefix_length (characters).
    #[arg(long)]
    prefix_length: Option<usize>,
    /// Override `prefix_aware`'s concurrency_threshold.
    #[arg(long)]
    concurrency_threshold: Option<usize>,
    /// Override `prefix_aware`'s balance factor (0 turns it off).
    #[arg(long)]
    balance_factor: Option<f64>,
    /// Multiply every instance's KV cache (`cache_blocks`, and so the
    /// `cache_tokens` given to `longest_prefix`) by this factor.
    #[arg(long, default_value_t = 1.0)]
    cache_scale: f64,
    /// Only these arms (default: all), e.g. `random,prefix_aware,longest_prefix`;
    /// also `prefix_aware_unbounded` (no balance factor).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Gateway replicas behind a round-robin balancer; a list (`1,2,4`) runs
    /// each workload at each count. Anything but `1` writes `replicas.md`
    /// instead of `routing.md`.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize])]
    replicas: Vec<usize>,
    /// `kv_aware` only: multiply its instances' KV blocks, prefill rate and
    /// step budget by this (about the SmolLM2 tokens a 4-byte chunk of the
    /// workload's text takes, ≈ 2), so they hold and prefill as much text as
    /// the other arms' instances.
    #[arg(long, default_value_t = 1.0)]
    kv_token_ratio: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut kinds: Vec<Kind> = args.workload.iter().flat_map(|w| w.kinds()).collect();
    kinds.dedup();
    let arms = if args.strategies.is_empty() {
        Arm::ALL.to_vec()
    } else {
        args.strategies
            .iter()
            .map(|s| Arm::parse(s).with_context(|| format!("unknown strategy {s:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    if !(args.cache_scale.is_finite() && args.cache_scale > 0.0) {
        anyhow::bail!("--cache-scale must be a positive number");
    }
    if args.replicas.contains(&0) {
        anyhow::bail!("--replicas must be at least 1");
    }
    let replica_run = args.replicas != [1];
    let mut results = Vec::new();
    for kind in kinds {
        let mut setup = kind.setup(args.quick, args.seed, &args.traces)?;
        if let Some(ts) = args.time_scale {
            setup.sim.time_scale = ts;
        }
        if let Some(n) = args.prefix_length {
            setup.routing.prefix_length = n;
        }
        if let Some(n) = args.concurrency_threshold {
            setup.routing.concurrency_threshold = n;
        }
        if let Some(c) = args.balance_factor {
            setup.routing.balance_factor = (c > 0.0).then_some(c);
        }
        if args.cache_scale != 1.0 {
            setup.scale_cache(args.cache_scale);
        }
        if !(args.kv_token_ratio.is_finite() && args.kv_token_ratio > 0.0) {
            anyhow::bail!("--kv-token-ratio must be a positive number");
        }
        setup.kv_token_ratio = args.kv_token_ratio;
        for &n in &args.replicas {
            setup.gateways = n;
            eprintln!(
                "{}: {} requests, {} KV tokens an instance, {n} gateway replica(s)",
                setup.id,
                setup.requests(),
                setup.cache_tokens()
            );
            let tag = format!("bench{n}");
            let result = bench(&setup, &arms, &tag, |line| eprintln!("  {line}")).await?;
            results.push(result);
        }
    }
    let ctx = Context {
        command: command_line(),
        date: utc_now(),
        machine: machine(),
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if replica_run {
        let md = args.out.join("replicas.md");
        std::fs::write(&md, report::replicas::markdown(&ctx, &results))?;
        eprintln!("wrote {}", md.display());
        return Ok(());
    }
    let md = args.out.join("routing.md");
    std::fs::write(&md, report::markdown(&ctx, &results))?;
    let svg = args.out.join("routing.svg");
    let subtitle = format!("{} · {}", ctx.date, ctx.command);
    std::fs::write(&svg, chart::svg(&results, &subtitle))?;
    eprintln!("wrote {} and {}", md.display(), svg.display());
    Ok(())
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cmd = "cargo run --release -p kvgate-bench --bin kvgate-loadbench --".to_owned();
    for a in args {
        cmd.push(' ');
        cmd.push_str(&a);
    }
    cmd
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock (civil-from-days, no date crate).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3_600,
        rem % 3_600 / 60
    )
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    format!(
        "{cores} logical cores ({cpu}), {} {}, shared with other work; gateway, \
         simulators and load generator in one process; {} build",
        std::env::consts::OS,
        std::env::consts::ARCH,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    )
}
