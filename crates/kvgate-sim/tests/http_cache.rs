//! The cache and timing model seen over real HTTP: hits, salts, eviction, held
//! blocks, queueing and aborts. Assertions rest on orderings and ratios that the
//! model guarantees (a sleep never ends early), never on tight wall-clock limits.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::time::Instant;

fn usage_opts(max_tokens: u64) -> serde_json::Value {
    json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": max_tokens})
}

#[tokio::test]
async fn shared_prefix_hits_and_cuts_ttft() {
    let sim = start(cfg()).await;
    let prefix = text(1, 1_000);
    let first = chat_body(&format!("{prefix}{}", text(2, 40)), usage_opts(2));
    let second = chat_body(&format!("{prefix}{}", text(3, 40)), usage_opts(2));
    let (cold, body1) = stream(&sim, "/v1/chat/completions", &first).await;
    let (warm, body2) = stream(&sim, "/v1/chat/completions", &second).await;
    assert_eq!(
        stream_usage(&body1)["prompt_tokens_details"]["cached_tokens"],
        0
    );
    let cached = stream_usage(&body2)["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 992, "cached {cached}");
    // Cold: ~1,046 tokens at 2,500/s ≈ 0.42 s; warm: one step for ~54 tokens ≈ 22 ms.
    assert!(cold >= Duration::from_millis(400), "cold {cold:?}");
    assert!(warm * 4 < cold, "warm {warm:?} vs cold {cold:?}");
    let st = sim.server.stats();
    assert_eq!((st.requests, st.cached_tokens), (2, cached));
    assert_eq!(st.queries_tokens, st.prompt_tokens);
}

#[tokio::test]
async fn different_cache_salts_never_share_blocks() {
    let sim = start(cfg()).await;
    let prompt = text(4, 600);
    let cached = |salt: &str| {
        let body = json!({"prompt": prompt, "max_tokens": 1, "cache_salt": salt});
        let sim = &sim;
        async move {
            let resp: serde_json::Value = post(sim, "/v1/completions", &body)
                .await
                .json()
                .await
                .unwrap();
            resp["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    assert_eq!(cached("tenant-a").await, 0);
    assert_eq!(cached("tenant-b").await, 0, "another salt must miss");
    assert_eq!(cached("tenant-a").await, 592, "the same salt hits");
    let unsalted = json!({"prompt": prompt, "max_tokens": 1});
    let resp: serde_json::Value = post(&sim, "/v1/completions", &unsalted)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(resp["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn tiny_cache_misses_after_eviction() {
    // 63 blocks: exactly one 1,000-token prompt (62 full blocks + 1 private).
    let sim = start(common::cfg_with(|c| c.cache_blocks = 63)).await;
    let a = json!({"prompt": text(5, 1_000), "max_tokens": 1});
    let b = json!({"prompt": text(6, 1_000), "max_tokens": 1});
    let cached = |body: serde_json::Value| {
        let sim = &sim;
        async move {
            let resp: serde_json::Value = post(sim, "/v1/completions", &body)
                .await
                .json()
                .await
                .unwrap();
            resp["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    assert_eq!(cached(a.clone()).await, 0);
    assert_eq!(cached(a.clone()).await, 992, "warm while it fits");
    assert_eq!(cached(b).await, 0);
    assert_eq!(cached(a).await, 0, "evicted by the other prompt");
}

#[tokio::test]
async fn blocks_held_by_a_running_request_are_not_evicted() {
    // A holds ~69 of 100 blocks while it decodes; B needs 63 more, so it must wait.
    let sim = start(common::cfg_with(|c| c.cache_blocks = 100)).await;
    let a = json!({"prompt": text(7, 1_000), "max_tokens": 100, "stream": true});
    let b = json!({"prompt": text(8, 1_000), "max_tokens": 1, "stream": true});
    let started = Instant::now();
    let a_task = tokio::spawn({
        let url = sim.url();
        async move {
            let resp = client()
                .post(format!("{url}/v1/completions"))
                .json(&a)
                .send()
                .await
                .unwrap();
            let body = resp.text().await.unwrap();
            (Instant::now(), body)
        }
    });
    let server = sim.server.clone();
    eventually("A running", || server.stats().running == 1).await;
    let b_task = tokio::spawn({
        let url = sim.url();
        async move {
            let mut resp = client()
                .post(format!("{url}/v1/completions"))
                .json(&b)
                .send()
                .await
                .unwrap();
            let _ = resp.chunk().await.unwrap();
            Instant::now()
        }
    });
    eventually("B queued", || server.stats().waiting == 1).await;
    assert_eq!(server.stats().running, 1, "B was not admitted beside A");
    let (a_end, a_body) = a_task.await.unwrap();
    let b_first = b_task.await.unwrap();
    assert!(b_first >= a_end, "B started before A released its blocks");
    let tokens = events(&a_body)
        .iter()
        .filter(|e| {
            e["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert_eq!(tokens, 100, "A ran to the end, undisturbed");
    assert!(a_end - started >= Duration::from_millis(400 + 99 * 5));
    assert_eq!(server.stats().aborted, 0);
}

#[tokio::test]
async fn queueing_beyond_max_running_grows_ttft() {
    let sim = start(common::cfg_with(|c| c.max_running = 1)).await;
    let server = sim.server.clone();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for seed in 0..3 {
        let body = chat_body(
            &text(10 + seed, 500),
            json!({"stream": true, "max_tokens": 20}),
        );
        let url = sim.url();
        tasks.push(tokio::spawn(async move {
            let mut resp = client()
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let _ = resp.chunk().await.unwrap();
            let first_chunk = start.elapsed();
            while resp.chunk().await.unwrap().is_some() {}
            first_chunk
        }));
    }
    eventually("two queued", || server.stats().waiting == 2).await;
    let metrics = client()
        .get(format!("{}/metrics", sim.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("vllm:num_requests_waiting{model_name="),
        "{metrics}"
    );
    let mut ttfts = Vec::new();
    for t in tasks {
        ttfts.push(t.await.unwrap());
    }
    ttfts.sort();
    // Each waits for the one before it to finish (19 × 5 ms of decode after its
    // first token), then prefills for ~0.2 s: first chunks come ≥ 0.295 s apart.
    assert!(
        ttfts[1] >= ttfts[0] + Duration::from_millis(250),
        "{ttfts:?}"
    );
    assert!(
        ttfts[2] >= ttfts[0] + Duration::from_millis(500),
        "{ttfts:?}"
    );
}

#[tokio::test]
async fn dropping_a_stream_aborts_and_frees_the_running_slot() {
    let sim = start(common::cfg_with(|c| c.max_running = 1)).await;
    let server = sim.server.clone();
    let long = json!({"prompt": text(20, 100), "max_tokens": 100_000, "stream": true});
    let mut resp = post(&sim, "/v1/completions", &long).await;
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    // A second request queues behind it.
    let next = tokio::spawn({
        let url = sim.url();
        async move {
            let body = json!({"prompt": "queued behind", "max_tokens": 3});
            client()
                .post(format!("{url}/v1/completions"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    eventually("queued", || server.stats().waiting == 1).await;
    drop(resp);
    eventually("abort", || server.stats().aborted == 1).await;
    assert_eq!(
        next.await.unwrap(),
        200,
        "the freed slot served the queued request"
    );
    eventually("idle", || server.stats().running == 0).await;
    assert_eq!(server.stats().kv_blocks_in_use, 0);
}

#[tokio::test]
async fn dropping_a_non_streaming_request_aborts_it() {
    let sim = start(cfg()).await;
    let server = sim.server.clone();
    let body = json!({"prompt": text(21, 100), "max_tokens": 100_000});
    let result = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .post(format!("{}/v1/completions", sim.url()))
        .json(&body)
        .send()
        .await;
    assert!(result.unwrap_err().is_timeout());
    eventually("abort", || server.stats().aborted == 1).await;
    assert_eq!((server.stats().running, server.stats().waiting), (0, 0));
}
