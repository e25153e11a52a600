//! The regimes where cache-aware routing used to lose to plain hashing, end
//! to end over HTTP against simulated vLLM instances under cache pressure:
//! closed-loop clients on shared documents, and engines that export no KV
//! capacity (SGLang, llama.cpp, TGI), where `longest_prefix` must learn it
//! from the `cached_tokens` the engines report. Bounds are generous: the
//! figures themselves are in `bench/results/matrix.md`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvgate_sim::{SimConfig, SimHandle};
use serde_json::{Value, json};

use super::cache_aware::text;
use crate::common::*;

const MODEL: &str = "cache-model";

/// `n` instances holding `cache_blocks` blocks of 16 tokens each.
async fn sims(n: usize, cache_blocks: usize, gauge: bool) -> Vec<SimHandle> {
    let cfg = SimConfig {
        model: MODEL.into(),
        cache_blocks,
        // 100× faster than real time: requests overlap, as under real load.
        time_scale: 0.01,
        default_max_tokens: 8,
        export_cache_config_info: gauge,
        ..SimConfig::llama70b_h100_tp4()
    };
    kvgate_sim::spawn_fleet(&cfg, n).await.unwrap()
}

fn yaml(sims: &[SimHandle], strategy: &str) -> String {
    let list: String = sims
        .iter()
        .enumerate()
        .map(|(i, s)| format!("      - {{ id: \"s{i}\", url: \"{}\" }}\n", s.url()))
        .collect();
    format!(
        "endpoints:\n  - name: docs\n    models: [\"{MODEL}\"]\n    instances:\n{list}    routing:\n      strategy: {strategy}\n      prefix_length: 1024\n"
    )
}

/// Questions about `docs` documents of 1,000 tokens, in a fixed shuffled order.
fn workload(docs: u64, requests: usize) -> Vec<Value> {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    (0..requests)
        .map(|i| {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            let d = h % docs;
            json!({"model": MODEL, "max_tokens": 8, "messages": [
                {"role": "system", "content": text(7000 + d, 1000)},
                {"role": "user", "content": text(90_000 + i as u64, 20)}]})
        })
        .collect()
}

/// `clients` closed-loop clients share `bodies`; the engines' cached ÷ prompt tokens.
async fn closed_loop(gw: &Gateway, bodies: Vec<Value>, clients: usize) -> f64 {
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let url = gw.url("/v1/chat/completions");
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (bodies, next, url) = (Arc::clone(&bodies), Arc::clone(&next), url.clone());
        tasks.push(tokio::spawn(async move {
            let (mut prompt, mut cached) = (0u64, 0u64);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { break };
                let r = client()
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(body).unwrap())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
                prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
                cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
            }
            (prompt, cached)
        }));
    }
    let (mut prompt, mut cached) = (0, 0);
    for t in tasks {
        let (p, c) = t.await.unwrap();
        prompt += p;
        cached += c;
    }
    cached as f64 / prompt as f64
}

/// Hit rate of `strategy` on a fresh fleet; the gateway too, for a look inside.
async fn run(strategy: &str, gauge: bool, clients: usize) -> (f64, Gateway) {
    // 4 instances of 256 blocks (4,096 tokens: 4 documents) for 24
    // documents: the fleet holds two thirds of them.
    let fleet = sims(4, 256, gauge).await;
    let gw = Gateway::start(&yaml(&fleet, strategy)).await;
    let hit = closed_loop(&gw, workload(24, 480), clients).await;
    drop(fleet);
    (hit, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_clients_on_shared_documents_hit_as_often_as_with_hashing() {
    let (hashing, _) = run("prefix_aware", true, 8).await;
    let (longest, _) = run("longest_prefix", true, 8).await;
    eprintln!(
        "closed loop, shared documents: prefix_aware {hashing:.3}, longest_prefix {longest:.3}"
    );
    assert!(
        longest >= hashing - 0.03,
        "longest_prefix {longest:.3} against prefix_aware {hashing:.3}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_a_cache_gauge_is_sized_by_the_cached_tokens_it_reports() {
    let (hashing, _) = run("prefix_aware", false, 4).await;
    let (longest, gw) = run("longest_prefix", false, 4).await;
    // The default assumes 384,000 tokens (6,000 index blocks of 64 tokens);
    // each engine holds 4,096 (64 blocks). What it reported cached shrank
    // the estimate well below the default.
    eprintln!("no cache gauge: prefix_aware {hashing:.3}, longest_prefix {longest:.3}");
    let rt = gw.state.runtime.load_full();
    for inst in &rt.endpoint("docs").unwrap().instances {
        eprintln!("{}: {} blocks believed", inst.id, inst.index.capacity());
        assert!(
            inst.index.capacity() <= 600,
            "{}: still believes {} blocks",
            inst.id,
            inst.index.capacity()
        );
    }
    assert!(
        longest >= hashing - 0.03,
        "longest_prefix {longest:.3} against prefix_aware {hashing:.3}"
    );
}
