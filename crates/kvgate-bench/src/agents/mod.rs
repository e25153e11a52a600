//! The agent benchmark (`kvgate-loadbench --agents`, issue 21): the
//! `coding-agent` workload under every strategy, a baseline first, over both
//! APIs a coding agent speaks — OpenAI chat, without and with the session's
//! id as `prompt_cache_key` (as Codex sends it), and Anthropic Messages (what
//! Claude Code sends: `system` on top, tool calls and tool results as blocks,
//! the session id in `metadata.user_id`) — into `agents.md` ([`report`]).
//!
//! The workload runs at `routing.md`'s size (24 sessions of 16–48 turns) on
//! the regime matrix's fleet ([`crate::matrix::sizes::fitted`]): 4 instances
//! whose KV caches hold about twice their share of the sessions' distinct
//! tokens, so placement decides what stays cached. Open loop, streamed,
//! `cache_tokens` configured. Each API's runs share one tokio
//! runtime, dropped after them (as the matrix does, so one API's leftover
//! gateway tasks do not tax the other's timings); the ceilings are measured
//! on each API's own bodies.

pub mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;

use crate::matrix::{in_fresh_runtime, sizes};
use crate::regime::{Api, Regime};
use crate::workload::{Kind, Size};
use crate::{Arm, WorkloadResult, bench_with};

/// Its strategies: the two load-only baselines, then the cache-aware three.
pub const ARMS: [Arm; 5] = [
    Arm::RoundRobin,
    Arm::LeastOutstanding,
    Arm::PrefixAware,
    Arm::LongestPrefix,
    Arm::KvAware,
];

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub arms: Vec<Arm>,
    pub apis: Vec<Api>,
    /// Seconds, not minutes (CI smoke).
    pub quick: bool,
    pub seed: u64,
    pub traces: PathBuf,
    /// The report's path.
    pub out: PathBuf,
}

impl Options {
    /// Every strategy over every API shape, written to `out`.
    pub fn full(traces: PathBuf, out: PathBuf) -> Self {
        Self {
            arms: ARMS.to_vec(),
            apis: Api::AGENTS.to_vec(),
            quick: false,
            seed: 7,
            traces,
            out,
        }
    }
}

/// Run every API under every arm, write the report; the results, one an API.
pub async fn run(
    opts: &Options,
    ctx: &crate::report::Context,
) -> anyhow::Result<Vec<WorkloadResult>> {
    let started = Instant::now();
    let build = crate::host::build();
    let size = if opts.quick {
        Size::MatrixQuick
    } else {
        Size::Full
    };
    let base = sizes::fitted(Kind::CodingAgent, size, opts.seed, &opts.traces)?;
    eprintln!(
        "{}: {} requests, {} instances, {} KV tokens an instance",
        base.id,
        base.requests(),
        base.instances,
        base.cache_tokens()
    );
    let mut results = Vec::with_capacity(opts.apis.len());
    for &api in &opts.apis {
        let mut setup = base.clone();
        setup.regime = Regime {
            api,
            ..Regime::default()
        };
        eprintln!("[{api}]");
        let tag = format!("agents-{api}");
        let w = in_fresh_runtime(|| async {
            bench_with(&setup, &opts.arms, &tag, true, |l| eprintln!("  {l}")).await
        })?;
        results.push(w);
    }
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let md = report::markdown(ctx, &build, &results, started.elapsed().as_secs_f64());
    std::fs::write(&opts.out, md).with_context(|| format!("writing {}", opts.out.display()))?;
    eprintln!(
        "wrote {} in {:.1} min",
        opts.out.display(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(results)
}
