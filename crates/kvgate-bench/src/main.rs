//! `kvgate-loadbench`: run the routing benchmark and write `routing.md` and
//! `routing.svg` into `--out`, or with `--replicas` other than 1, `replicas.md`;
//! with `--matrix`, the regime matrix's `matrix.md` (`matrix-slice.md` when
//! narrowed by `--workload`, `--arrivals`, `--stream`, `--capacity`, `--api` or
//! `--strategies`; `matrix-quick.md` with `--quick`; `matrix-density.md` when
//! `--density` names any density but 4); with `--agents`, the
//! agent benchmark's `agents.md` (`agents-slice.md` when narrowed by `--api`
//! or `--strategies`, `agents-quick.md` with `--quick`); `kvgate-loadbench
//! fairness`: the fair-queueing benchmark's `fairness.md`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use kvgate_bench::density::Density;
use kvgate_bench::matrix::{self, Options};
use kvgate_bench::report;
use kvgate_bench::{
    Api, Arm, Arrivals, Capacity, Kind, Regime, agents, bench, chart, fairness, host,
};

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
    CodingAgent,
}

impl WorkloadArg {
    fn kinds(self) -> Vec<Kind> {
        match self {
            WorkloadArg::All => Kind::ALL.to_vec(),
            WorkloadArg::CodingAgent => vec![Kind::CodingAgent],
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
    #[command(subcommand)]
    command: Option<Command>,
    /// Which workloads to run (repeatable). `all` is `routing.md`'s six;
    /// with `--matrix`, those and `coding-agent`.
    #[arg(long, value_enum, default_values_t = [WorkloadArg::All])]
    workload: Vec<WorkloadArg>,
    /// A tiny run (seconds), for CI and smoke tests.
    #[arg(long)]
    quick: bool,
    /// Run the regime matrix (every workload × arrivals × stream × capacity,
    /// `prefix_aware`, `longest_prefix` and `kv_aware`) into `matrix.md`.
    #[arg(long)]
    matrix: bool,
    /// Run the agent benchmark (the coding-agent workload, every strategy,
    /// over OpenAI chat and Anthropic Messages) into `agents.md`.
    #[arg(long, conflicts_with = "matrix")]
    agents: bool,
    /// The API chat sessions are sent over: `openai` (chat completions, the
    /// default), `messages` (Anthropic's `/v1/messages`, as Claude Code
    /// sends it) or `openai-keyed` (chat completions with `prompt_cache_key`
    /// = the session's id). With `--matrix` or `--agents`, a list narrows it.
    #[arg(long, value_delimiter = ',')]
    api: Vec<String>,
    /// Arrivals: `open` (Poisson, the default) or `closed:N` (N clients, each
    /// sending when its last request answers). With `--matrix`, a list
    /// narrows the matrix (default `open,closed:1,closed:4,closed:8,closed:32`).
    #[arg(long, value_delimiter = ',')]
    arrivals: Vec<String>,
    /// `true` (the default) or `false`: send `stream: false`, so TTFT is the
    /// time to the whole answer. With `--matrix`, a list narrows it.
    #[arg(long, value_delimiter = ',')]
    stream: Vec<bool>,
    /// KV capacity for `longest_prefix` / `kv_aware`: `configured`
    /// (`cache_tokens` set, the default), `learned` (from the instances'
    /// `vllm:cache_config_info`) or `unknown` (no gauge, no `cache_tokens`).
    /// With `--matrix`, a list narrows it (default `learned,unknown`).
    #[arg(long, value_delimiter = ',')]
    capacity: Vec<String>,
    /// With `--matrix`: text densities, characters a token (`4,2,1.3`; `4`,
    /// the workloads' own English-like text, by default), one more dimension:
    /// each workload's text recoded to it (code-like ASCII at 1.8 and above,
    /// CJK below) and the simulated engines counting the bytes a token that
    /// makes. Writes `matrix-density.md`.
    #[arg(long, value_delimiter = ',')]
    density: Vec<String>,
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

/// Benchmarks other than routing's.
#[derive(Subcommand, Debug)]
enum Command {
    /// Fair queueing between tenants on a saturated fleet (issue 22), into
    /// `fairness.md`; needs the release `kvgate` binary.
    Fairness(fairness::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Fairness(f)) = &args.command {
        let path = fairness::run(f, &host::context()).await?;
        eprintln!("wrote {}", path.display());
        return Ok(());
    }
    let arrivals = args
        .arrivals
        .iter()
        .map(|a| Arrivals::parse(a).with_context(|| format!("--arrivals {a:?}: open or closed:N")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let capacities = args
        .capacity
        .iter()
        .map(|c| {
            Capacity::parse(c)
                .with_context(|| format!("--capacity {c:?}: configured, learned or unknown"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let apis = args
        .api
        .iter()
        .map(|a| {
            Api::parse(a).with_context(|| format!("--api {a:?}: openai, messages or openai-keyed"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let densities = Density::parse_list(&args.density)?;
    if args.matrix {
        return run_matrix(&args, arrivals, capacities, apis, densities).await;
    }
    if args.agents {
        if !(arrivals.is_empty()
            && args.stream.is_empty()
            && capacities.is_empty()
            && densities.is_empty())
        {
            anyhow::bail!(
                "--agents runs open loop, streamed, capacity configured, at the workload's own density"
            );
        }
        return run_agents(&args, apis).await;
    }
    let replica_run = args.replicas != [1];
    // Behind replicas a list of APIs runs each workload over each.
    if arrivals.len() > 1
        || args.stream.len() > 1
        || capacities.len() > 1
        || (apis.len() > 1 && !replica_run)
    {
        anyhow::bail!(
            "one --arrivals, --stream, --capacity and --api each without --matrix (--api may list several with --replicas)"
        );
    }
    if densities.iter().any(|d| !d.is_english()) {
        // routing.md and replicas.md do not show a density: only the matrix runs one.
        anyhow::bail!("--density other than 4 needs --matrix");
    }
    let mut regime = Regime::default();
    regime.arrivals = arrivals.first().copied().unwrap_or(regime.arrivals);
    regime.stream = args.stream.first().copied().unwrap_or(regime.stream);
    regime.capacity = capacities.first().copied().unwrap_or(regime.capacity);
    regime.api = apis.first().copied().unwrap_or(regime.api);
    let mut kinds: Vec<Kind> = args.workload.iter().flat_map(|w| w.kinds()).collect();
    kinds.dedup();
    let arms = if args.strategies.is_empty() {
        Arm::ALL.to_vec()
    } else {
        parse_arms(&args.strategies)?
    };
    if !(args.cache_scale.is_finite() && args.cache_scale > 0.0) {
        anyhow::bail!("--cache-scale must be a positive number");
    }
    if args.replicas.contains(&0) {
        anyhow::bail!("--replicas must be at least 1");
    }
    let mut results = Vec::new();
    let runs: Vec<(Kind, Api)> = kinds
        .iter()
        .flat_map(|&k| {
            let apis: Vec<Api> = if apis.is_empty() {
                vec![regime.api]
            } else {
                apis.clone()
            };
            apis.into_iter().map(move |a| (k, a))
        })
        .collect();
    for (kind, api) in runs {
        let mut setup = kind.setup(args.quick, args.seed, &args.traces)?;
        if apis.len() > 1 {
            setup.id = format!("{} over {api}", setup.id);
        }
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
        setup.regime = Regime { api, ..regime };
        for &n in &args.replicas {
            setup.gateways = n;
            setup.separate_processes = replica_run;
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
    let ctx = host::context();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if replica_run {
        // Messages alone has its own file, so both APIs' runs can stand.
        let name = if apis == [Api::Messages] {
            "replicas-messages.md"
        } else {
            "replicas.md"
        };
        let md = args.out.join(name);
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

/// `--matrix`: the whole matrix, or the slice the other flags narrow it to.
async fn run_matrix(
    args: &Args,
    arrivals: Vec<Arrivals>,
    capacities: Vec<Capacity>,
    apis: Vec<Api>,
    densities: Vec<Density>,
) -> anyhow::Result<()> {
    let mut opts = Options::full(args.traces.clone(), args.out.join("matrix.md"));
    opts.quick = args.quick;
    opts.seed = args.seed;
    let mut sliced = false;
    if args.time_scale.is_some() {
        opts.time_scale = args.time_scale;
        sliced = true;
    }
    if !args.workload.contains(&WorkloadArg::All) {
        opts.kinds = args.workload.iter().flat_map(|w| w.kinds()).collect();
        opts.kinds.dedup();
        sliced = true;
    }
    if !arrivals.is_empty() {
        opts.arrivals = arrivals;
        sliced = true;
    }
    if !args.stream.is_empty() {
        opts.streams.clone_from(&args.stream);
        sliced = true;
    }
    if !capacities.is_empty() {
        opts.capacities = capacities;
        sliced = true;
    }
    if !apis.is_empty() {
        opts.apis = apis;
        sliced = true;
    }
    if !args.strategies.is_empty() {
        opts.arms = parse_arms(&args.strategies)?;
        sliced = true;
    }
    let dense = densities.iter().any(|d| !d.is_english());
    if !densities.is_empty() {
        opts.densities = densities;
    }
    // Only the whole matrix at its real size writes `matrix.md`.
    if dense {
        opts.out = args.out.join("matrix-density.md");
    } else if sliced {
        opts.out = args.out.join("matrix-slice.md");
    } else if args.quick {
        opts.out = args.out.join("matrix-quick.md");
    }
    matrix::run(&opts, &host::context()).await?;
    Ok(())
}

/// `--agents`: every strategy over both APIs, or the slice `--api` and
/// `--strategies` narrow it to.
async fn run_agents(args: &Args, apis: Vec<Api>) -> anyhow::Result<()> {
    let mut opts = agents::Options::full(args.traces.clone(), args.out.join("agents.md"));
    opts.quick = args.quick;
    opts.seed = args.seed;
    let sliced = !apis.is_empty() || !args.strategies.is_empty();
    if !apis.is_empty() {
        opts.apis = apis;
    }
    if !args.strategies.is_empty() {
        opts.arms = parse_arms(&args.strategies)?;
    }
    if sliced {
        opts.out = args.out.join("agents-slice.md");
    } else if args.quick {
        opts.out = args.out.join("agents-quick.md");
    }
    agents::run(&opts, &host::context()).await?;
    Ok(())
}

fn parse_arms(names: &[String]) -> anyhow::Result<Vec<Arm>> {
    names
        .iter()
        .map(|s| Arm::parse(s).with_context(|| format!("unknown strategy {s:?}")))
        .collect()
}
