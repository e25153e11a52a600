//! Workload `hot-document`: a RAG service whose document popularity is Zipf, the
//! top document taking 40% of requests, on instances that prefill one request at
//! a time, so the instance that holds a hot document can be overrun by it.

use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::{SimConfig, block_text};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Content, Routing, Session, Setup, Size, Turn, exp_gap};
use crate::regime::Regime;

/// Block ids of documents, and of questions: disjoint from each other.
const DOC_BASE: u64 = 6 << 40;
const QUESTION_BASE: u64 = 7 << 40;

struct Params {
    docs: usize,
    doc_tokens: usize,
    /// Share of requests that ask about the most popular document.
    top_share: f64,
    requests: usize,
    rate: f64,
    output: (u32, u32),
    time_scale: f64,
}

pub(super) fn setup(size: Size, seed: u64) -> Setup {
    let p = match size {
        Size::Quick => Params {
            docs: 8,
            doc_tokens: 2_000,
            top_share: 0.4,
            requests: 30,
            rate: 8.0,
            output: (16, 64),
            time_scale: 0.02,
        },
        Size::Full => Params {
            docs: 32,
            doc_tokens: 8_000,
            top_share: 0.4,
            requests: 10_000,
            rate: 100.0,
            output: (16, 64),
            time_scale: 0.25,
        },
        // The same rate on 4 instances: the top document (40 req/s) still
        // takes all a holder admits.
        Size::Matrix => Params {
            docs: 32,
            doc_tokens: 8_000,
            top_share: 0.4,
            requests: 400,
            rate: 100.0,
            output: (16, 64),
            time_scale: 0.01,
        },
        Size::MatrixQuick => Params {
            docs: 8,
            doc_tokens: 2_000,
            top_share: 0.4,
            requests: 24,
            rate: 40.0,
            output: (8, 24),
            time_scale: 0.01,
        },
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6864);
    let docs: Vec<Arc<str>> = (0..p.docs as u64)
        .map(|d| Arc::from(block_text(DOC_BASE + d, p.doc_tokens)))
        .collect();
    let s = zipf_exponent(p.docs, p.top_share);
    let cumulative = zipf_cdf(p.docs, s);
    let mut at = Duration::ZERO;
    let sessions = (0..p.requests)
        .map(|i| {
            at += exp_gap(&mut rng, p.rate);
            let u: f64 = rng.random();
            let doc = cumulative.partition_point(|&c| c < u).min(p.docs - 1);
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
    let cfg = SimConfig {
        max_partial_prefills: Some(1),
        time_scale: p.time_scale,
        ..SimConfig::llama70b_h100_tp4()
    };
    let cache_docs = cfg.cache_blocks * cfg.block_size / p.doc_tokens.max(1);
    let cold_s = p.doc_tokens as f64 / cfg.prefill_tokens_per_s;
    let step_s = cfg.inter_token_latency.as_secs_f64();
    let admits = 1.0 / step_s.max(1e-9);
    let top_rate = p.rate * share(&cumulative, 0);
    Setup {
        id: "hot-document".to_owned(),
        description: format!(
            "A RAG service: {} requests, Poisson at {} req/s (simulated); each asks a 16–64-token \
             question about one of {} documents of {} tokens sent as the system prompt, with \
             Zipf popularity (exponent {:.2}: the top document takes {:.0}% of requests, the \
             second {:.0}%, the top 8 {:.0}%), and gets {}–{} output tokens. 7 instances of the \
             preset that prefill one request at a time (vLLM `--max-num-partial-prefills 1`): a \
             cold document holds its instance's prefill for {:.2} s, and even a cached one takes \
             a {:.0} ms step to itself, so an instance admits at most {:.0} requests/s. Each \
             instance's cache holds {} such documents{}. Spread evenly, each warm instance \
             admits {:.1} req/s ({:.0}% of that most); the top document alone brings {:.1} \
             req/s ({:.0}%){}. P90 TTFT mostly measures the cold start (every instance's \
             first prefill of each document it is sent), P50 the steady state.",
            p.requests,
            p.rate,
            p.docs,
            p.doc_tokens,
            s,
            100.0 * share(&cumulative, 0),
            100.0 * share(&cumulative, 1),
            100.0 * cumulative.get(7).copied().unwrap_or(1.0),
            p.output.0,
            p.output.1,
            cold_s,
            1e3 * step_s,
            admits,
            cache_docs,
            if p.docs <= cache_docs {
                format!(", so every instance can hold all {}", p.docs)
            } else {
                String::new()
            },
            p.rate / 7.0,
            100.0 * p.rate / 7.0 / admits,
            top_rate,
            100.0 * top_rate / admits,
            // Poisson arrivals at (nearly) the service rate: the queue has no bound.
            if top_rate >= 0.99 * admits {
                ", more than one instance can serve: it has to be replicated"
            } else {
                ""
            },
        ),
        instances: 7,
        sim: cfg,
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

/// Probability of rank `i` (from 0) under `cumulative`.
fn share(cumulative: &[f64], i: usize) -> f64 {
    let hi = cumulative.get(i).copied().unwrap_or(1.0);
    let lo = i
        .checked_sub(1)
        .and_then(|j| cumulative.get(j))
        .copied()
        .unwrap_or(0.0);
    hi - lo
}

/// Cumulative probabilities of ranks 1..=n with weight k^-s.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total.max(f64::MIN_POSITIVE);
            acc
        })
        .collect()
}

/// The exponent s at which rank 1 of `n` takes `top` of the mass (bisection; the
/// top share grows with s, from 1/n at s = 0 towards 1).
fn zipf_exponent(n: usize, top: f64) -> f64 {
    let top_share = |s: f64| zipf_cdf(n, s).first().copied().unwrap_or(1.0);
    let (mut lo, mut hi) = (0.0, 16.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if top_share(mid) < top {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_exponent_gives_the_asked_top_share() {
        let s = zipf_exponent(64, 0.4);
        let cdf = zipf_cdf(64, s);
        assert!((cdf[0] - 0.4).abs() < 1e-9, "{}", cdf[0]);
        assert!((cdf[63] - 1.0).abs() < 1e-9);
        assert!((1.0..2.0).contains(&s), "s = {s}");
        assert!((share(&cdf, 1) - 0.4 * 2f64.powf(-s)).abs() < 1e-9);
    }

    #[test]
    fn sampled_popularity_follows_the_distribution() {
        let setup = setup(Size::Full, 3);
        let mut counts = std::collections::HashMap::<&str, usize>::new();
        for s in &setup.sessions {
            *counts.entry(s.system.as_deref().unwrap_or("")).or_default() += 1;
        }
        let most = counts.values().copied().max().unwrap_or(0);
        let share = most as f64 / setup.sessions.len() as f64;
        assert!((0.37..0.43).contains(&share), "top document share {share}");
        assert_eq!(setup.sim.max_partial_prefills, Some(1));
    }
}
