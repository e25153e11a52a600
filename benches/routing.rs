//! Criterion benchmarks of the hot path: placement alone (ring walk and
//! bounded-load choice) for 2–64 instances, and the whole routing decision
//! (parse, validate, window, key, plan) for chat bodies of 4 KiB to 1 MiB.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "benchmark setup")]

use std::hint::black_box;

use axum::http::HeaderMap;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvgate::routing::{self, Load, PolicySpec, Strategy};
use kvgate_prefix::Api;

fn placement(c: &mut Criterion) {
    let mut g = c.benchmark_group("placement");
    for n in [2usize, 8, 16, 64] {
        let ids: Vec<String> = (0..n)
            .map(|i| format!("http://10.0.{}.{}:8000", i / 256, i % 256))
            .collect();
        let policy = routing::build(&PolicySpec {
            strategy: Strategy::PrefixAware,
            ids: &ids,
            virtual_nodes: 160,
            concurrency_threshold: 10,
            balance_factor: None,
        });
        // A busy fleet: a quarter of the instances at the threshold, so some keys overflow.
        let loads: Vec<Load> = (0..n)
            .map(|i| Load {
                in_flight: if i % 4 == 0 { 10 } else { i % 7 },
                available: true,
            })
            .collect();
        let mut k = 0u64;
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                k = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
                black_box(policy.plan(black_box(k), &loads))
            })
        });
    }
    g.finish();
}

fn chat_body(bytes: usize) -> Vec<u8> {
    let system =
        "You are a meticulous assistant for the ACME support team. ".repeat(bytes / 2 / 58 + 1);
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    let mut used = system.len();
    let mut turn = 0;
    while used < bytes {
        let text = format!("Turn {turn}: could you explain the previous answer in more detail? ")
            .repeat(20);
        used += text.len();
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": text}));
        turn += 1;
    }
    serde_json::to_vec(&serde_json::json!({"model": "m", "stream": true, "messages": messages}))
        .unwrap()
}

fn decision(c: &mut Criterion) {
    let yaml = r#"
endpoints:
  - name: chat
    models: ["m"]
    instances:
      - url: "http://10.0.0.1:8000"
      - url: "http://10.0.0.2:8000"
      - url: "http://10.0.0.3:8000"
      - url: "http://10.0.0.4:8000"
      - url: "http://10.0.0.5:8000"
      - url: "http://10.0.0.6:8000"
      - url: "http://10.0.0.7:8000"
    routing: { strategy: prefix_aware, prefix_length: 4096, concurrency_threshold: 10 }
"#;
    let rt = kvgate::Runtime::build(kvgate::Config::from_yaml(yaml).unwrap(), None).unwrap();
    let headers = HeaderMap::new();
    let mut g = c.benchmark_group("routing_decision_chat");
    for (name, size) in [("4KiB", 4 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20)] {
        let body = Bytes::from(chat_body(size));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let a = kvgate::route_input::analyse(
                    &rt,
                    Api::Chat,
                    None,
                    &headers,
                    body.clone(),
                    "tenant",
                )
                .unwrap();
                let ep = &a.input.endpoint;
                let loads: Vec<Load> = ep.instances.iter().map(|i| i.load()).collect();
                black_box(ep.policy.plan(a.input.key, &loads))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, placement, decision);
criterion_main!(benches);
