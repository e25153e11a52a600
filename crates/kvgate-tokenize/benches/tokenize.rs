//! `PromptTokenizer::chat` on a 16 KiB chat body (a long system prompt and a
//! few turns) with the SmolLM2 fixture: cold (segment cache cleared before
//! each call), warm (the same body again) and a new question (system prompt
//! and earlier turns seen, the last user turn new), which is the common case
//! on the `kv_aware` request path; and a new tool output (an agent's next
//! turn: a 2 KiB test log, digit-dense, every line new). Target: well under
//! 1 ms median warm.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kvgate_tokenize::PromptTokenizer;
use serde_json::{Value, json};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../fixtures/smollm2/tokenizer.json"
);

/// Prose from a pseudo-random walk over a word list (not one phrase
/// repeated, which the BPE's own word cache would make unrealistically cheap).
fn prose(len: usize, seed: u64) -> String {
    const WORDS: &[&str] = &[
        "the",
        "assistant",
        "must",
        "answer",
        "using",
        "only",
        "retrieved",
        "context",
        "café",
        "naïve",
        "policy",
        "refund",
        "customer",
        "2024-05-17",
        "order",
        "#48213",
        "shipping",
        "within",
        "business",
        "days",
        "never",
        "reveal",
        "internal",
        "tools",
        "JSON",
        "schema",
        "{\"id\": 7}",
        "escalate",
        "to",
        "a",
        "human",
        "when",
        "unsure",
        "—",
        "résumé",
        "Zürich",
        "timeout",
        "retry",
        "backoff",
        "tokens",
        "cache",
        "prefix",
        "of",
        "and",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push_str(WORDS[(x >> 33) as usize % WORDS.len()]);
        out.push_str(match (x >> 20) % 16 {
            0 => ".\n",
            1 => ", ",
            _ => " ",
        });
    }
    out
}

fn body(question: &str) -> Value {
    json!({"model": "smollm2", "messages": [
        {"role": "system", "content": prose(14 << 10, 1)},
        {"role": "user", "content": prose(600, 2)},
        {"role": "assistant", "content": prose(600, 3)},
        {"role": "user", "content": question}
    ]})
}

fn bench(c: &mut Criterion) {
    let Ok(tok) = PromptTokenizer::load(FIXTURE, None) else {
        eprintln!("cannot load {FIXTURE}");
        return;
    };
    let body = body(&prose(300, 4));
    let len = serde_json::to_vec(&body).map_or(0, |b| b.len());
    eprintln!("chat body: {len} bytes of JSON");
    let mut g = c.benchmark_group("chat_16KiB");
    g.bench_function("cold", |b| {
        b.iter_batched(
            || tok.clear_cache(),
            |()| black_box(tok.chat(&body, usize::MAX)),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("warm", |b| {
        let _ = tok.chat(&body, usize::MAX);
        b.iter(|| black_box(tok.chat(&body, usize::MAX)))
    });
    let n = AtomicU64::new(0);
    g.bench_function("warm_new_question", |b| {
        b.iter_batched(
            || body_with_question(&body, n.fetch_add(1, Ordering::Relaxed)),
            |fresh| black_box(tok.chat(&fresh, usize::MAX)),
            BatchSize::SmallInput,
        )
    });
    let n = AtomicU64::new(0);
    g.bench_function("warm_new_tool_output", |b| {
        b.iter_batched(
            || body_with_last(&body, test_log(n.fetch_add(1, Ordering::Relaxed))),
            |fresh| black_box(tok.chat(&fresh, usize::MAX)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// About 2 KiB of a test run's log, its numbers new for each `n`.
fn test_log(n: u64) -> String {
    let mut out = String::new();
    for i in 0..40 {
        let ms = (n * 7919 + i * 104_729) % 9973;
        out.push_str(&format!("test suite_{n}::case_{i} ... ok ({ms} ms)\n"));
    }
    out
}

fn body_with_last(base: &Value, content: String) -> Value {
    let mut body = base.clone();
    if let Some(last) = body.pointer_mut("/messages/3/content") {
        *last = Value::from(content);
    }
    body
}

fn body_with_question(base: &Value, n: u64) -> Value {
    let mut body = base.clone();
    if let Some(last) = body.pointer_mut("/messages/3/content") {
        *last = Value::from(format!("Question {n}: {}", prose(300, n + 100)));
    }
    body
}

criterion_group!(benches, bench);
criterion_main!(benches);
