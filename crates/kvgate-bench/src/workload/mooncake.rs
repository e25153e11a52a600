//! Workload 3: replay of the Mooncake (FAST'25) traces. Each request's prompt is
//! `block_text(id, 512)` for each of its `hash_ids`, cut to `input_length` tokens,
//! so equal ids share exactly the trace's reusable prefix.
//!
//! To run in minutes the replay keeps every k-th *prefix chain* (requests grouped by
//! their first two block ids, selected by a fixed hash), so the reuse structure
//! survives, and compresses time by the same k, so requests arrive at the
//! trace's own rate.
//!
//! The trace is read by kvgate-simulate's parser ([`kvgate_simulate::trace`]),
//! in the file's order.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kvgate_sim::SimConfig;
use kvgate_simulate::trace::{TraceError, TraceRequest, parse_lines};

use super::{Content, Routing, Session, Setup, Size, Turn};
use crate::regime::Regime;

/// The two traces and their published single-infinite-cache reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trace {
    Conversation,
    Synthetic,
}

impl Trace {
    pub fn file(self) -> &'static str {
        match self {
            Trace::Conversation => "mooncake_conversation.jsonl",
            Trace::Synthetic => "mooncake_synthetic.jsonl",
        }
    }

    /// Fraction of blocks a single infinite cache reuses over the whole trace.
    pub fn ceiling(self) -> f64 {
        match self {
            Trace::Conversation => 0.366,
            Trace::Synthetic => 0.640,
        }
    }
}

struct Params {
    /// Keep one prefix chain in `keep_one_in`, and compress time by it.
    keep_one_in: u64,
    /// At most this many requests (quick mode).
    limit: usize,
    /// Cap on output tokens (quick mode), so a tiny run stays tiny.
    max_output: u32,
    /// Arrival times are divided by `keep_one_in × speedup`: 1 keeps the
    /// trace's own rate; the matrix's 4 instances get 4/7 of it.
    speedup: f64,
    time_scale: f64,
}

pub(super) fn setup(trace: Trace, path: &Path, size: Size) -> anyhow::Result<Setup> {
    let p = match (size, trace) {
        (Size::Quick, _) => Params {
            keep_one_in: 64,
            limit: 24,
            max_output: 32,
            speedup: 1.0,
            time_scale: 0.005,
        },
        (Size::Full, Trace::Conversation) => Params {
            keep_one_in: 6,
            limit: usize::MAX,
            max_output: u32::MAX,
            speedup: 1.0,
            time_scale: 0.05,
        },
        (Size::Full, Trace::Synthetic) => Params {
            keep_one_in: 3,
            limit: usize::MAX,
            max_output: u32::MAX,
            speedup: 1.0,
            time_scale: 0.05,
        },
        (Size::Matrix, Trace::Conversation) => Params {
            keep_one_in: 48,
            limit: 100,
            max_output: u32::MAX,
            speedup: 4.0 / 7.0,
            time_scale: 0.01,
        },
        (Size::Matrix, Trace::Synthetic) => Params {
            keep_one_in: 12,
            limit: 120,
            max_output: u32::MAX,
            speedup: 4.0 / 7.0,
            time_scale: 0.01,
        },
        (Size::MatrixQuick, _) => Params {
            keep_one_in: 64,
            limit: 12,
            max_output: 16,
            speedup: 4.0 / 7.0,
            time_scale: 0.005,
        },
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines = parse_lines(&text).map_err(|e| not_a_record(path, e))?;
    let total = lines.len();
    let kept: Vec<TraceRequest> = lines
        .into_iter()
        .filter(|l| chain_hash(&l.hash_ids).checked_rem(p.keep_one_in) == Some(0))
        .take(p.limit)
        .collect();
    let t0 = kept.first().map_or(0.0, |l| l.timestamp);
    let k = p.keep_one_in as f64 * p.speedup;
    let sessions: Vec<Session> = kept
        .into_iter()
        .map(|l| Session {
            start: Duration::from_secs_f64((l.timestamp - t0.min(l.timestamp)) / 1000.0 / k),
            system: None,
            turns: vec![Turn {
                think: Duration::ZERO,
                max_tokens: u32::try_from(l.output_length)
                    .unwrap_or(u32::MAX)
                    .clamp(1, p.max_output),
                content: Content::Trace {
                    hash_ids: l.hash_ids,
                    tokens: l.input_length,
                },
            }],
            forks: Vec::new(),
        })
        .collect();
    let span = sessions.last().map_or(0.0, |s| s.start.as_secs_f64());
    Ok(Setup {
        id: format!(
            "mooncake-{}",
            match trace {
                Trace::Conversation => "conversation",
                Trace::Synthetic => "synthetic",
            }
        ),
        description: format!(
            "`{}`: {} of its {} requests (every prefix chain whose first two block ids hash \
             to 0 mod {}), arrival times divided by {} so they come at the trace's own rate \
             ({:.0} s simulated). Completions API; prompts rebuilt from `hash_ids` and cut to \
             `input_length`; `max_tokens` = `output_length`. 7 instances of the preset \
             (24,000 KV blocks each). Published single-infinite-cache ceiling of the whole \
             trace: {:.1}%.",
            trace.file(),
            sessions.len(),
            total,
            p.keep_one_in,
            k,
            span,
            100.0 * trace.ceiling()
        ),
        instances: 7,
        sim: SimConfig {
            time_scale: p.time_scale,
            ..SimConfig::llama70b_h100_tp4()
        },
        routing: Routing {
            prefix_length: 4096,
            concurrency_threshold: 64,
            balance_factor: Some(1.2),
        },
        sessions,
        trace_ceiling: Some(trace.ceiling()),
        cache_scale: 1.0,
        gateways: 1,
        separate_processes: false,
        kv_token_ratio: 1.0,
        kv_prefill_ratio: None,
        density: super::Density::ENGLISH,
        regime: Regime::default(),
    })
}

/// The parser's error as `PATH:LINE: not a Mooncake record`, its cause below.
fn not_a_record(path: &Path, e: TraceError) -> anyhow::Error {
    match e {
        TraceError::Json { line, error } => anyhow::Error::new(error)
            .context(format!("{}:{line}: not a Mooncake record", path.display())),
        e => anyhow::Error::new(e).context(format!("{}: not a Mooncake record", path.display())),
    }
}

/// A fixed hash of a request's first two block ids: its prefix chain.
fn chain_hash(ids: &[u64]) -> u64 {
    ids.iter()
        .take(2)
        .fold(0x243f_6a88_85a3_08d3, |h, &id| splitmix(h ^ id))
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
