//! Workload 2, ShareGPT-like chat: conversations arrive as a Poisson process and
//! each sends several turns, the history (with the model's real answers) growing
//! turn by turn, with a think time between an answer and the next question.

use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::{SimConfig, block_text};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Content, Routing, Session, Setup, Size, Turn, exp_gap, log_normal};
use crate::regime::Regime;

/// Block ids of user messages start here: disjoint from other workloads' ids.
const MESSAGE_BASE: u64 = 3 << 40;

const SYSTEM: &str = "You are a helpful, honest assistant. Answer the user's questions \
                      carefully and concisely, and say so when you are not sure.";

struct Params {
    conversations: usize,
    rate: f64,
    turns: (usize, usize),
    think_mean_s: f64,
    time_scale: f64,
}

/// One ShareGPT-like conversation of `turns.0..=turns.1` turns: a first question
/// of log-normal length (median 200 tokens), follow-ups median 60, answers median
/// 180 tokens (16–800), exponential think time of mean `think_mean_s` before each
/// follow-up. Message texts are `block_text` of ids counted up from `next_id`.
pub(super) fn conversation(
    rng: &mut impl Rng,
    next_id: &mut u64,
    turns: (usize, usize),
    think_mean_s: f64,
) -> Vec<Turn> {
    let count = rng.random_range(turns.0..=turns.1.max(turns.0));
    (0..count)
        .map(|t| {
            // First questions are longer (pasted context), follow-ups short.
            let median = if t == 0 { 200.0 } else { 60.0 };
            let tokens = log_normal(rng, median, 1.0, 8.0, 2_000.0) as usize;
            *next_id += 1;
            Turn {
                think: if t == 0 {
                    Duration::ZERO
                } else {
                    exp_gap(rng, 1.0 / think_mean_s)
                },
                max_tokens: log_normal(rng, 180.0, 0.8, 16.0, 800.0) as u32,
                content: Content::Chat(block_text(*next_id, tokens)),
            }
        })
        .collect()
}

pub(super) fn setup(size: Size, seed: u64) -> Setup {
    let p = match size {
        Size::Quick => Params {
            conversations: 8,
            rate: 4.0,
            turns: (2, 3),
            think_mean_s: 1.0,
            time_scale: 0.02,
        },
        Size::Full => Params {
            conversations: 400,
            rate: 1.5,
            turns: (2, 10),
            think_mean_s: 10.0,
            time_scale: 0.1,
        },
        Size::Matrix => Params {
            conversations: 16,
            rate: 0.9,
            turns: (2, 10),
            think_mean_s: 10.0,
            time_scale: 0.01,
        },
        Size::MatrixQuick => Params {
            conversations: 4,
            rate: 4.0,
            turns: (2, 3),
            think_mean_s: 1.0,
            time_scale: 0.01,
        },
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6d74);
    let system: Arc<str> = Arc::from(SYSTEM);
    let mut next_id = MESSAGE_BASE;
    let mut at = Duration::ZERO;
    let sessions = (0..p.conversations)
        .map(|_| {
            at += exp_gap(&mut rng, p.rate);
            Session {
                start: at,
                system: Some(Arc::clone(&system)),
                turns: conversation(&mut rng, &mut next_id, p.turns, p.think_mean_s),
                forks: Vec::new(),
            }
        })
        .collect();
    Setup {
        id: "multi-turn".to_owned(),
        description: format!(
            "{} conversations arriving Poisson at {}/s (simulated), {}–{} turns each; a \
             short shared system prompt, a first question of log-normal length (median 200 \
             tokens), follow-ups median 60 tokens, answers median 180 tokens (16–800), \
             exponential think time (mean {} s) between an answer and the next question. \
             Each turn resends the whole history including the answers as streamed. \
             7 instances of the preset (24,000 KV blocks each).",
            p.conversations, p.rate, p.turns.0, p.turns.1, p.think_mean_s
        ),
        instances: 7,
        sim: SimConfig {
            time_scale: p.time_scale,
            ..SimConfig::llama70b_h100_tp4()
        },
        routing: Routing {
            prefix_length: 1024,
            concurrency_threshold: 64,
            balance_factor: Some(1.2),
        },
        sessions,
        trace_ceiling: None,
        cache_scale: 1.0,
        gateways: 1,
        separate_processes: false,
        kv_token_ratio: 1.0,
        kv_prefill_ratio: None,
        density: super::Density::ENGLISH,
        regime: Regime::default(),
    }
}
