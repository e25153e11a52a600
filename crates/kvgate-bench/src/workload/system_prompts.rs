//! Workload `system-prompts`: many multi-turn conversations over a few long system
//! prompts, so a fixed-window key sees only as many keys as there are prompts.

use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::{SimConfig, block_text};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::multi_turn::conversation;
use super::{Routing, Session, Setup, Size, exp_gap};
use crate::regime::Regime;

/// Block ids of the system prompts, and of user messages: disjoint from each other.
const SYSTEM_BASE: u64 = 4 << 40;
const MESSAGE_BASE: u64 = 5 << 40;

struct Params {
    prompts: u64,
    prompt_tokens: usize,
    conversations: usize,
    rate: f64,
    turns: (usize, usize),
    think_mean_s: f64,
    time_scale: f64,
}

pub(super) fn setup(size: Size, seed: u64) -> Setup {
    let p = match size {
        Size::Quick => Params {
            prompts: 3,
            prompt_tokens: 1_000,
            conversations: 9,
            rate: 4.0,
            turns: (2, 3),
            think_mean_s: 1.0,
            time_scale: 0.02,
        },
        Size::Full => Params {
            prompts: 3,
            prompt_tokens: 3_000,
            conversations: 240,
            rate: 1.5,
            turns: (2, 10),
            think_mean_s: 10.0,
            time_scale: 0.1,
        },
        Size::Matrix => Params {
            prompts: 3,
            prompt_tokens: 3_000,
            conversations: 20,
            rate: 0.9,
            turns: (2, 10),
            think_mean_s: 10.0,
            time_scale: 0.01,
        },
        Size::MatrixQuick => Params {
            prompts: 2,
            prompt_tokens: 1_000,
            conversations: 4,
            rate: 4.0,
            turns: (2, 3),
            think_mean_s: 1.0,
            time_scale: 0.01,
        },
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7370);
    let prompts: Vec<Arc<str>> = (0..p.prompts)
        .map(|i| Arc::from(block_text(SYSTEM_BASE + i, p.prompt_tokens)))
        .collect();
    let mut next_id = MESSAGE_BASE;
    let mut at = Duration::ZERO;
    let sessions = (0..p.conversations)
        .map(|_| {
            at += exp_gap(&mut rng, p.rate);
            let prompt = rng.random_range(0..prompts.len());
            Session {
                start: at,
                system: prompts.get(prompt).cloned(),
                turns: conversation(&mut rng, &mut next_id, p.turns, p.think_mean_s),
                forks: Vec::new(),
            }
        })
        .collect();
    Setup {
        id: "system-prompts".to_owned(),
        description: format!(
            "{} conversations arriving Poisson at {}/s (simulated), {}–{} turns each, each \
             under one of {} system prompts of {} tokens (uniform), in multi-turn's shape: \
             first question median 200 tokens, follow-ups median 60, answers median 180 \
             (16–800), exponential think time (mean {} s); each turn resends the whole \
             history with the answers as streamed. `prefix_length` (1,024 characters) ends \
             inside the system prompt, so `prefix_aware` sees only {} keys: unbounded, all \
             traffic lands on at most {} of the 7 instances; bounded, every overflow pays the \
             conversation's history cold. Routing that follows each conversation's own \
             prefix can keep histories warm and still spread. 7 instances of the preset \
             (24,000 KV blocks each).",
            p.conversations,
            p.rate,
            p.turns.0,
            p.turns.1,
            p.prompts,
            p.prompt_tokens,
            p.think_mean_s,
            p.prompts,
            p.prompts,
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
