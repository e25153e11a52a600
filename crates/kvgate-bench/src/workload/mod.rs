//! What a benchmark run sends: sessions of turns on a simulated clock, and the fleet
//! and routing settings each workload is measured with.

mod coding_agent;
mod hot_document;
mod long_context;
mod mooncake;
mod multi_turn;
mod recode;
mod system_prompts;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::SimConfig;
use rand::Rng;

use crate::density::Density;
use crate::regime::Regime;

pub use mooncake::Trace;

/// One client conversation (a single request is a one-turn session).
#[derive(Clone, Debug)]
pub struct Session {
    /// Simulated time at which its first turn is sent.
    pub start: Duration,
    /// Shared system prompt, sent first in every turn's messages.
    pub system: Option<Arc<str>>,
    pub turns: Vec<Turn>,
    /// Sub-agents: each branches from this session's history after one of its
    /// turns, plays its own turns on a copy of it, and the session goes on
    /// (from its own history) once the sub-agent's last answer is in.
    pub forks: Vec<Fork>,
}

/// A sub-agent of a session ([`Session::forks`]).
#[derive(Clone, Debug)]
pub struct Fork {
    /// Index of the parent's turn after whose answer it branches.
    pub after: usize,
    pub turns: Vec<Turn>,
}

/// One request of a session.
#[derive(Clone, Debug)]
pub struct Turn {
    /// Simulated pause after the previous turn's answer before this one is sent.
    pub think: Duration,
    pub max_tokens: u32,
    pub content: Content,
}

/// What a turn asks.
#[derive(Clone, Debug)]
pub enum Content {
    /// A chat user message, appended to the session's history (and the answer after it).
    Chat(String),
    /// A tool's output answering the previous answer, a tool call (coding
    /// agents): over chat the same user message as [`Content::Chat`]; over
    /// Messages a `tool_result` block for that answer's `tool_use` block.
    ToolResult(String),
    /// A completions prompt rebuilt from Mooncake block ids: `block_text(id, 512)`
    /// for each id, cut to `tokens` simulated tokens.
    Trace { hash_ids: Vec<u64>, tokens: usize },
}

/// The gateway's routing settings for the `prefix_aware` runs (the other
/// strategies ignore them).
#[derive(Clone, Copy, Debug)]
pub struct Routing {
    pub prefix_length: usize,
    pub concurrency_threshold: usize,
    pub balance_factor: Option<f64>,
}

/// A workload ready to run: its sessions, fleet and routing settings.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Short id, used in endpoint names and the report (`long-context`, …).
    pub id: String,
    /// One paragraph for the report: what is sent and why these sizes.
    pub description: String,
    pub instances: usize,
    /// Gateway replicas in front of the instances (`--replicas`), each sent
    /// every n-th request.
    pub gateways: usize,
    /// Each replica its own `kvgate serve` process (the release binary
    /// beside this one), sharing state through a `redis-server` started for
    /// the run (`cluster.sync_ms`); otherwise `kvgate::serve` tasks in this
    /// process that share nothing.
    pub separate_processes: bool,
    pub sim: SimConfig,
    pub routing: Routing,
    pub sessions: Vec<Session>,
    /// A published reuse ceiling to report the hit rate against (Mooncake).
    pub trace_ceiling: Option<f64>,
    /// Factor applied to the workload's own `sim.cache_blocks` ([`Setup::scale_cache`]).
    pub cache_scale: f64,
    /// `kv_aware` only (`--kv-token-ratio`): its instances' KV capacity,
    /// prefill rate and step budget times this, so that at about this many
    /// SmolLM2 tokens per 4-byte chunk they hold and prefill the same text
    /// in the same time as the other arms' instances. 1: the same numbers of tokens.
    pub kv_token_ratio: f64,
    /// `kv_aware` only: its instances' prefill rate and step budget times
    /// this instead of `kv_token_ratio` — the ratio over the text they
    /// prefill (each turn's new text, which tokenizes differently from a
    /// long shared prompt), where `kv_token_ratio` is over all they hold.
    pub kv_prefill_ratio: Option<f64>,
    /// Characters a token of the text sent (`--density`; 4, the workloads'
    /// own filler, unless [`Setup::at_density`] recoded it).
    pub density: Density,
    /// Arrivals, streaming and capacity (default: open loop, streaming,
    /// `cache_tokens` configured).
    pub regime: Regime,
}

impl Setup {
    /// Requests the setup sends.
    pub fn requests(&self) -> usize {
        self.sessions
            .iter()
            .map(|s| s.turns.len() + s.forks.iter().map(|f| f.turns.len()).sum::<usize>())
            .sum()
    }

    /// Multiply every instance's KV capacity by `factor` (> 0), rounding to whole
    /// blocks; the description stays that of the workload's own sizes.
    pub fn scale_cache(&mut self, factor: f64) {
        let blocks = (self.sim.cache_blocks as f64 * factor).round();
        // `as` saturates; at least one block.
        self.sim.cache_blocks = (blocks as usize).max(1);
        self.cache_scale *= factor;
    }

    /// KV capacity of one instance, tokens.
    pub fn cache_tokens(&self) -> usize {
        self.sim.cache_blocks.saturating_mul(self.sim.block_size)
    }

    /// The instances' config under `kv_aware`, scaled by `kv_token_ratio`
    /// (KV blocks) and `kv_prefill_ratio` (prefill rate, step budget).
    pub fn kv_sim(&self) -> SimConfig {
        let usable = |r: f64| r.is_finite() && r > 0.0 && (r - 1.0).abs() > 1e-9;
        let r = self.kv_token_ratio;
        let p = self.kv_prefill_ratio.unwrap_or(r);
        let mut sim = self.sim.clone();
        // `as` saturates; at least one.
        if usable(r) {
            sim.cache_blocks = ((sim.cache_blocks as f64 * r).round() as usize).max(1);
        }
        if usable(p) {
            sim.max_batched_tokens = ((sim.max_batched_tokens as f64 * p).round() as usize).max(1);
            sim.prefill_tokens_per_s *= p;
        }
        sim
    }
}

/// The workloads the CLI knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    LongContext,
    MultiTurn,
    MooncakeConversation,
    MooncakeSynthetic,
    SystemPrompts,
    HotDocument,
    CodingAgent,
}

/// How big a workload is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// `routing.md`'s sizes.
    Full,
    /// Seconds, for CI (`--quick`).
    Quick,
    /// One cell of the regime matrix (`--matrix`): small enough that 140
    /// cells × 3 strategies run in about 25 minutes on 2 cores.
    Matrix,
    /// `--matrix --quick`.
    MatrixQuick,
}

impl Size {
    pub fn is_quick(self) -> bool {
        matches!(self, Size::Quick | Size::MatrixQuick)
    }
}

impl Kind {
    /// `routing.md`'s workloads (`--workload all`).
    pub const ALL: [Kind; 6] = [
        Kind::LongContext,
        Kind::MultiTurn,
        Kind::MooncakeConversation,
        Kind::MooncakeSynthetic,
        Kind::SystemPrompts,
        Kind::HotDocument,
    ];

    /// The regime matrix's workloads: `ALL` and the coding agent.
    pub const MATRIX: [Kind; 7] = [
        Kind::LongContext,
        Kind::MultiTurn,
        Kind::MooncakeConversation,
        Kind::MooncakeSynthetic,
        Kind::SystemPrompts,
        Kind::HotDocument,
        Kind::CodingAgent,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Kind::LongContext => "long-context",
            Kind::MultiTurn => "multi-turn",
            Kind::MooncakeConversation => "mooncake-conversation",
            Kind::MooncakeSynthetic => "mooncake-synthetic",
            Kind::SystemPrompts => "system-prompts",
            Kind::HotDocument => "hot-document",
            Kind::CodingAgent => "coding-agent",
        }
    }

    /// Build the workload; `quick` makes a CI-sized one. Mooncake kinds read
    /// `{traces}/mooncake_{conversation,synthetic}.jsonl`.
    pub fn setup(self, quick: bool, seed: u64, traces: &Path) -> anyhow::Result<Setup> {
        let size = if quick { Size::Quick } else { Size::Full };
        self.setup_sized(size, seed, traces)
    }

    /// Build the workload at `size`. The matrix sizes keep each workload's
    /// fleet (7 instances, the preset's cache): [`crate::matrix`] resizes it.
    pub fn setup_sized(self, size: Size, seed: u64, traces: &Path) -> anyhow::Result<Setup> {
        match self {
            Kind::LongContext => Ok(long_context::setup(size, seed)),
            Kind::MultiTurn => Ok(multi_turn::setup(size, seed)),
            Kind::SystemPrompts => Ok(system_prompts::setup(size, seed)),
            Kind::HotDocument => Ok(hot_document::setup(size, seed)),
            Kind::CodingAgent => Ok(coding_agent::setup(size, seed)),
            Kind::MooncakeConversation => mooncake::setup(
                Trace::Conversation,
                &traces.join(Trace::Conversation.file()),
                size,
            ),
            Kind::MooncakeSynthetic => mooncake::setup(
                Trace::Synthetic,
                &traces.join(Trace::Synthetic.file()),
                size,
            ),
        }
    }
}

/// A Poisson process's next gap at `rate` per second.
pub(crate) fn exp_gap(rng: &mut impl Rng, rate: f64) -> Duration {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    Duration::from_secs_f64(-u.ln() / rate.max(f64::EPSILON))
}

/// A log-normal draw with this median and shape, clamped to `[lo, hi]`.
pub(crate) fn log_normal(rng: &mut impl Rng, median: f64, sigma: f64, lo: f64, hi: f64) -> f64 {
    // Box–Muller from two uniforms.
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (median * (sigma * z).exp()).clamp(lo, hi)
}
