//! Workload 1, SageMaker's long-context case: 8,000-token shared documents as the
//! system prompt, a short unique question each, Poisson arrivals, 7 instances.

use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::{SimConfig, block_text};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Content, Routing, Session, Setup, Size, Turn, exp_gap};
use crate::regime::Regime;

/// Block ids of documents start here, of questions at `QUESTION_BASE`: never equal.
const DOC_BASE: u64 = 1 << 40;
const QUESTION_BASE: u64 = 2 << 40;

struct Params {
    docs: u64,
    doc_tokens: usize,
    requests: usize,
    rate: f64,
    output: (u32, u32),
    time_scale: f64,
}

pub(super) fn setup(size: Size, seed: u64) -> Setup {
    let p = match size {
        Size::Quick => Params {
            docs: 6,
            doc_tokens: 2_000,
            requests: 28,
            rate: 8.0,
            output: (64, 192),
            time_scale: 0.02,
        },
        Size::Full => Params {
            docs: 192,
            doc_tokens: 8_000,
            requests: 3_000,
            rate: 10.0,
            output: (128, 384),
            time_scale: 0.1,
        },
        // 4 instances: the open-loop rate is 10/s scaled to 4 of 7.
        Size::Matrix => Params {
            docs: 16,
            doc_tokens: 8_000,
            requests: 96,
            rate: 6.0,
            output: (16, 64),
            time_scale: 0.02,
        },
        Size::MatrixQuick => Params {
            docs: 4,
            doc_tokens: 2_000,
            requests: 12,
            rate: 8.0,
            output: (8, 24),
            time_scale: 0.01,
        },
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let docs: Vec<Arc<str>> = (0..p.docs)
        .map(|d| Arc::from(block_text(DOC_BASE + d, p.doc_tokens)))
        .collect();
    let mut at = Duration::ZERO;
    let sessions = (0..p.requests)
        .map(|i| {
            at += exp_gap(&mut rng, p.rate);
            let doc = rng.random_range(0..docs.len());
            let question_tokens = rng.random_range(16..=64);
            Session {
                start: at,
                system: docs.get(doc).cloned(),
                turns: vec![Turn {
                    think: Duration::ZERO,
                    max_tokens: rng.random_range(p.output.0..=p.output.1),
                    content: Content::Chat(block_text(QUESTION_BASE + i as u64, question_tokens)),
                }],
                forks: Vec::new(),
            }
        })
        .collect();
    let cfg = SimConfig::llama70b_h100_tp4();
    let cache_docs = cfg.cache_blocks * cfg.block_size / p.doc_tokens.max(1);
    Setup {
        id: "long-context".to_owned(),
        description: format!(
            "{} requests, Poisson at {} req/s (simulated); each asks a 16–64-token question \
             about one of {} documents of {} tokens (uniform popularity) sent as the system \
             prompt, and gets {}–{} output tokens. 7 instances of the Llama-3.1-70B / 4×H100 \
             preset: {} KV blocks ({} documents) each, so the document set is {:.1}× one \
             instance's cache and {:.0}% of the fleet's.",
            p.requests,
            p.rate,
            p.docs,
            p.doc_tokens,
            p.output.0,
            p.output.1,
            cfg.cache_blocks,
            cache_docs,
            p.docs as f64 / cache_docs.max(1) as f64,
            100.0 * p.docs as f64 / (7 * cache_docs).max(1) as f64,
        ),
        instances: 7,
        sim: SimConfig {
            time_scale: p.time_scale,
            ..cfg
        },
        routing: Routing {
            prefix_length: 4096,
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
