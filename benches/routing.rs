//! Criterion benchmarks of the hot path: placement alone (ring walk and
//! bounded-load choice) for 2–64 instances, the whole routing decision
//! (parse, validate, window, key, plan) for chat bodies of 4 KiB to 1 MiB, and
//! the whole `longest_prefix` decision (that, plus the block chain, an index
//! lookup on every instance and the dispatch's insert) for a 64 KiB body on 7
//! and 64 instances whose indexes hold 100,000 chains, and (issue 31) for a
//! 16 KiB body on 7 to 1,000 instances whose indexes are full at the default
//! capacity. A counting allocator
//! measures the index's real bytes per entry and prints it.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "benchmark setup")]

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};

use axum::http::HeaderMap;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvgate_prefix::Api;
use kvgate_routing::{self as routing, BlockIndex, Load, PolicySpec, Request, Strategy};

mod common;

/// Live heap bytes, to measure the index (std has no such counter), over
/// jemalloc: the allocator the gateway ships (`src/main.rs`), so that the
/// allocations of a decision cost here what they cost there.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// SAFETY: forwards to jemalloc and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { JEMALLOC.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { JEMALLOC.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { JEMALLOC.realloc(p, l, new_size) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { JEMALLOC.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

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
            block_chars: 256,
            block_size: 16,
        });
        // A busy fleet: a quarter of the instances at the threshold, so some keys overflow.
        let loads: Vec<Load> = (0..n)
            .map(|i| Load::with_in_flight(if i % 4 == 0 { 10 } else { i % 7 }))
            .collect();
        let mut k = 0u64;
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                k = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
                black_box(policy.plan(&Request::with_key(black_box(k)), &loads))
            })
        });
    }
    g.finish();
}

fn chat_body(bytes: usize) -> Vec<u8> {
    let messages = common::conversation(bytes);
    serde_json::to_vec(&serde_json::json!({"model": "m", "stream": true, "messages": messages}))
        .unwrap()
}

/// The canonicalise layer's work for a chat body from tenant "tenant".
fn analyse(rt: &kvgate::Runtime, headers: &HeaderMap, body: &Bytes) -> kvgate::request::Analysis {
    kvgate::request::analyse(rt, Api::Chat, None, headers, body.clone(), "tenant").unwrap()
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
                let a = analyse(&rt, &headers, &body);
                let ep = &a.input.endpoint;
                let (loads, _) = a.input.view();
                black_box(ep.policy.plan(&Request::with_key(a.input.key), &loads))
            })
        });
    }
    g.finish();
}

fn fleet_yaml(n: usize, cache_tokens: usize) -> String {
    let instances = common::instances_yaml(n, |_| String::new());
    format!(
        "endpoints:\n  - name: chat\n    models: [\"m\"]\n    instances:\n{instances}    \
         routing: {{ strategy: longest_prefix, cache_tokens: {cache_tokens} }}\n"
    )
}

/// Chains of 16 blocks: 100,000 of them spread over the fleet, plus the body's
/// own conversation (its system prompt and first turns) on a few instances.
fn warm(rt: &kvgate::Runtime, chains: u64, body_chain: &[u64]) {
    let ep = &rt.endpoints[0];
    let n = ep.instances.len() as u64;
    for c in 0..chains {
        let chain: Vec<u64> = (0..16)
            .map(|b| (c << 8 | b).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        ep.instances[(c % n) as usize].index.insert(&chain);
    }
    for (j, inst) in ep.instances.iter().take(3).enumerate() {
        inst.index
            .insert(&body_chain[..body_chain.len() * (j + 1) / 4]);
    }
}

fn longest_prefix_decision(c: &mut Criterion) {
    let body = Bytes::from(chat_body(64 << 10));
    let headers = HeaderMap::new();
    let mut g = c.benchmark_group("longest_prefix_decision_64KiB");
    for n in [7usize, 64] {
        // Room for every chain: 100,000 × 16 blocks over n instances, 64 tokens a block.
        let cache = (100_000 * 16 / n + 1_000) * 64;
        let rt = kvgate::Runtime::build(
            kvgate::Config::from_yaml(&fleet_yaml(n, cache)).unwrap(),
            None,
        )
        .unwrap();
        let a = analyse(&rt, &headers, &body);
        warm(&rt, 100_000, &a.input.chain);
        g.bench_function(BenchmarkId::from_parameter(format!("{n}_instances")), |b| {
            b.iter(|| {
                let a = analyse(&rt, &headers, &body);
                let ep = &a.input.endpoint;
                let (loads, _) = a.input.view();
                let req = a.input.routing_request();
                let plan = ep.policy.plan(&req, &loads);
                let chosen = &ep.instances[plan.order[0]];
                black_box(chosen.index.insert(&a.input.chain))
            })
        });
    }
    g.finish();
}

/// The default KV capacity an instance is modelled with (`cache_tokens`).
const CACHE_TOKENS: usize = 384_000;

/// A fleet of `n` instances whose indexes are full at the default capacity
/// (6,000 blocks of 256 characters each: conversations under shared system
/// prompts, see `common::fill_index`), with `body`'s first half (its system
/// prompt) on every 16th instance and its first three quarters on one holder.
fn full_fleet(n: usize, headers: &HeaderMap, body: &Bytes) -> kvgate::Runtime {
    let rt = kvgate::Runtime::build(
        kvgate::Config::from_yaml(&fleet_yaml(n, CACHE_TOKENS)).unwrap(),
        None,
    )
    .unwrap();
    let chain = analyse(&rt, headers, body).input.chain;
    let ep = &rt.endpoints[0];
    for (i, inst) in ep.instances.iter().enumerate() {
        common::fill_index(&inst.index, i as u64);
        assert!(inst.index.is_full(), "instance {i} filled");
    }
    for inst in ep.instances.iter().skip(5).step_by(16) {
        inst.index.insert(&chain[..chain.len() / 2]);
    }
    ep.instances[n * 3 / 7]
        .index
        .insert(&chain[..chain.len() * 3 / 4]);
    rt
}

/// Issue 31: the whole `longest_prefix` decision for a 16 KiB chat body on
/// 7 to 1,000 instances with full indexes (see [`full_fleet`]), as
/// `longest_prefix_decision` measures it: analyse, a lookup in every
/// instance's index, the plan, the winner's insert. Each fleet is built only
/// when its case runs (a filter skips the others' setup) and dropped after.
fn longest_prefix_at_scale(c: &mut Criterion) {
    let body = Bytes::from(chat_body(16 << 10));
    let headers = HeaderMap::new();
    let mut g = c.benchmark_group("longest_prefix_decision_16KiB");
    for n in common::FLEETS {
        let mut fleet: Option<kvgate::Runtime> = None;
        g.bench_function(BenchmarkId::from_parameter(format!("{n}_instances")), |b| {
            let rt = fleet.get_or_insert_with(|| full_fleet(n, &headers, &body));
            let a = analyse(rt, &headers, &body);
            let (loads, _) = a.input.view();
            let plan = a
                .input
                .endpoint
                .policy
                .plan(&a.input.routing_request(), &loads);
            assert_eq!(plan.reason, routing::Reason::CacheHit, "the holder leads");
            b.iter(|| {
                let a = analyse(rt, &headers, &body);
                let ep = &a.input.endpoint;
                let (loads, _) = a.input.view();
                let req = a.input.routing_request();
                let plan = ep.policy.plan(&req, &loads);
                let chosen = &ep.instances[plan.order[0]];
                black_box(chosen.index.insert(&a.input.chain))
            })
        });
    }
    g.finish();
}

/// Where [`longest_prefix_at_scale`]'s time goes at 1,000 instances: each
/// step of the decision alone, on the same full fleet.
fn longest_prefix_parts(c: &mut Criterion) {
    let body = Bytes::from(chat_body(16 << 10));
    let headers = HeaderMap::new();
    let mut fleet: Option<kvgate::Runtime> = None;
    let mut g = c.benchmark_group("longest_prefix_parts_16KiB_1000_instances");
    for part in ["analyse", "view", "plan", "insert"] {
        g.bench_function(part, |b| {
            let rt = fleet.get_or_insert_with(|| full_fleet(1000, &headers, &body));
            let a = analyse(rt, &headers, &body);
            let ep = &a.input.endpoint;
            let (loads, _) = a.input.view();
            let req = a.input.routing_request();
            let first = ep.policy.plan(&req, &loads).order[0];
            match part {
                "analyse" => b.iter(|| analyse(rt, &headers, &body)),
                "view" => b.iter(|| a.input.view()),
                "plan" => b.iter(|| ep.policy.plan(black_box(&req), &loads)),
                _ => b.iter(|| ep.instances[first].index.insert(&a.input.chain)),
            }
        });
    }
    g.finish();
}

/// Real heap bytes per index entry (printed; `routing::index::ENTRY_BYTES` is the estimate).
fn index_memory(_c: &mut Criterion) {
    let entries = 1_000_000usize;
    let before = LIVE.load(Ordering::Relaxed);
    let idx = BlockIndex::new(entries, 256);
    let chain: Vec<u64> = (0..entries as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    for part in chain.chunks(1000) {
        idx.insert(part);
    }
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    eprintln!(
        "index memory: {} entries, {bytes} bytes, {:.1} bytes per entry (estimate used in metrics: {})",
        idx.len(),
        bytes as f64 / idx.len() as f64,
        routing::index::ENTRY_BYTES
    );
    black_box(idx);
}

criterion_group!(
    benches,
    placement,
    decision,
    longest_prefix_decision,
    longest_prefix_at_scale,
    longest_prefix_parts,
    index_memory
);
criterion_main!(benches);
