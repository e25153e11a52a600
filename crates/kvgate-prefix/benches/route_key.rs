//! The whole routing decision the gateway makes per request — parse, window,
//! key — for chat and native bodies of 4 KiB, 64 KiB and 1 MiB.
//! Target: under 100 µs median for a 64 KiB chat body.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvgate_prefix::{
    chat_window, default_prompt_members, native_window, parse_strict, routing_key,
};
use serde_json::json;

/// SageMaker's largest `PrefixLength`: the most work a window can ask for.
const PREFIX_LENGTH: usize = 65_536;
const SIZES: [(&str, usize); 3] = [("4KiB", 4 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20)];

/// Prose-like text with punctuation, newlines (escaped in JSON) and some
/// non-ASCII, as system prompts and documents are.
fn prose(len: usize) -> String {
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
        "policy:",
        "tokens",
        "cache",
        "prefix",
        "“quoted”",
        "routing",
        "instance",
        "—",
        "JSON",
        "request",
        "latency",
        "über",
        "GPU",
        "memory",
        "and",
        "or",
        "never",
        "always",
    ];
    let mut s = String::with_capacity(len + 16);
    let mut i = 0usize;
    while s.len() < len {
        s.push_str(WORDS[(i * 7 + i / 3) % WORDS.len()]);
        s.push(if i % 23 == 22 { '\n' } else { ' ' });
        i += 1;
    }
    s
}

fn chat_body(size: usize) -> Vec<u8> {
    let turns = json!([
        {"role": "user", "content": "What does the policy say about cache eviction?"},
        {"role": "assistant", "content": prose(600)},
        {"role": "user", "content": [{"type": "text", "text": "And for long prompts?"}]},
    ]);
    let overhead = serde_json::to_vec(&turns).map_or(0, |v| v.len()) + 200;
    let body = json!({
        "model": "llama-3.1-70b-instruct",
        "messages": std::iter::once(json!({"role": "system", "content": prose(size.saturating_sub(overhead))}))
            .chain(turns.as_array().cloned().unwrap_or_default())
            .collect::<Vec<_>>(),
        "max_tokens": 512,
        "temperature": 0.2,
        "stream": true,
    });
    serde_json::to_vec_pretty(&body).unwrap_or_default()
}

fn native_body(size: usize) -> Vec<u8> {
    let body = json!({
        "parameters": {"max_new_tokens": 512, "temperature": 0.2, "top_p": 0.9, "stop": ["</s>"]},
        "inputs": prose(size.saturating_sub(200)),
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

fn route(c: &mut Criterion) {
    let members = default_prompt_members();
    let mut group = c.benchmark_group("route_key");
    for (name, size) in SIZES {
        let chat = chat_body(size);
        group.throughput(Throughput::Bytes(chat.len() as u64));
        group.bench_with_input(BenchmarkId::new("chat", name), &chat, |b, body| {
            b.iter(|| {
                let value = parse_strict(black_box(body)).ok()?;
                let window = chat_window(&value, PREFIX_LENGTH).ok()?;
                Some(routing_key("tenant", "", window.as_bytes()))
            })
        });
        let native = native_body(size);
        group.throughput(Throughput::Bytes(native.len() as u64));
        group.bench_with_input(BenchmarkId::new("native", name), &native, |b, body| {
            b.iter(|| {
                let value = parse_strict(black_box(body)).ok()?;
                let window = native_window(&value, &members, PREFIX_LENGTH);
                Some(routing_key("tenant", "", &window))
            })
        });
    }
    group.finish();

    // The parts of the 64 KiB chat decision, to see where the time goes.
    let chat = chat_body(64 << 10);
    let mut parts = c.benchmark_group("route_key_parts_64KiB_chat");
    parts.bench_function("parse_strict", |b| {
        b.iter(|| parse_strict(black_box(&chat)).is_ok())
    });
    parts.bench_function("serde_json_from_slice", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&chat)).is_ok())
    });
    if let Ok(value) = parse_strict(&chat) {
        parts.bench_function("chat_window", |b| {
            b.iter(|| chat_window(black_box(&value), PREFIX_LENGTH).map(|w| w.len()))
        });
        if let Ok(window) = chat_window(&value, PREFIX_LENGTH) {
            parts.bench_function("routing_key", |b| {
                b.iter(|| routing_key("tenant", "", black_box(window.as_bytes())))
            });
        }
    }
    parts.finish();
}

criterion_group!(benches, route);
criterion_main!(benches);
