//! Requests as a user sends them, through the gateway to real vLLM: a stream
//! with the engine's usage, a client leaving mid-stream (the engine aborts),
//! a Responses follow-up on the engine that stored its parent, and every
//! cache-aware strategy reaching the engine's prefix cache, and requests
//! waiting in the gateway while the engine reports its KV cache full.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::engines::{self, BLOCK, MODEL};
use super::gateway::{self, ask, chat, document, usage};

/// The last `data:` line of a stream that carries a usage object.
fn usage_of_stream(text: &str) -> Value {
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_carries_the_engines_usage_and_cached_tokens() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let mut body = ask(&document("streamed", 300), "Name three colours.");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body["max_tokens"] = json!(8);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = gw.chat(&body).await;
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let text = r.text().await.unwrap();
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        seen.push(usage(&usage_of_stream(&text)));
    }
    let (prompt, cached) = seen[1];
    assert_eq!(seen[0].1, 0, "a cold prompt reported cached tokens");
    assert!(
        cached >= (prompt / BLOCK as u64 - 1) * BLOCK as u64,
        "the repeat: {cached} of {prompt} cached"
    );
    // The gateway counted the engine's figures.
    let metrics = gw.metrics().await;
    assert!(metrics.contains("cached"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_makes_vllm_abort_the_request() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "prefix_aware", "").await;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to one thousand in words."}],
        "max_tokens": 1500,
        "ignore_eos": true,
        "stream": true
    });
    let running = || async {
        let mut n = 0.0;
        for e in &fleet.engines {
            n += e.metric("vllm:num_requests_running").await;
        }
        n
    };
    let r = gw.chat(&body).await;
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    // Some tokens arrive: the engine is generating.
    let mut got = 0;
    while got < 3 {
        stream.next().await.unwrap().unwrap();
        got += 1;
    }
    assert_eq!(running().await, 1.0);
    // 1,500 tokens take minutes on a CPU; leaving must end it in seconds.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    while running().await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "vLLM still runs the abandoned request"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gw.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_follow_up_reaches_the_engine_that_stored_its_parent() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let post = |body: Value| {
        let url = gw.url("/v1/responses");
        async move {
            let (status, v) = engines::post_json(&url, None, &body).await;
            assert_eq!(status, 200, "{v}");
            v
        }
    };
    let first = post(json!({
        "model": MODEL,
        "input": "My name is Ada. Say hello.",
        "max_output_tokens": 8,
        "store": true
    }))
    .await;
    let id = first["id"].as_str().unwrap().to_owned();
    // Each follow-up must find its parent in the one engine's store; vLLM
    // answers 404 from the other (its store is per process).
    let mut previous = id;
    for turn in 0..3 {
        let next = post(json!({
            "model": MODEL,
            "input": format!("Turn {turn}: what is my name?"),
            "previous_response_id": previous,
            "max_output_tokens": 8
        }))
        .await;
        // Answered from its parent (vLLM 404s a parent it does not hold);
        // 8 tokens may end the answer before the model does.
        let done = next["status"] == "completed"
            || next["incomplete_details"]["reason"] == "max_output_tokens";
        assert!(done, "{next}");
        assert_eq!(next["previous_response_id"], json!(previous), "{next}");
        previous = next["id"].as_str().unwrap().to_owned();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_prefix_strategy_reaches_the_engines_prefix_cache() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    for strategy in ["prefix_aware", "longest_prefix", "kv_aware"] {
        let gw = gateway::start(fleet, &["e0", "e1"], strategy, "").await;
        for d in 0..3 {
            let doc = document(&format!("{strategy} {d}"), 300);
            let mut cached = Vec::new();
            for q in ["Who?", "What?", "Where?"] {
                let (prompt, c) = usage(&chat(&gw, None, &ask(&doc, q)).await);
                cached.push((prompt, c));
            }
            for &(prompt, c) in &cached[1..] {
                assert!(
                    c >= (prompt / BLOCK as u64 - 2) * BLOCK as u64,
                    "{strategy}: document {d}: cached (prompt, cached) {cached:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_in_the_gateway_while_the_engine_reports_its_kv_cache_full() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    // "Full" at 5% so that one running request fills it: the engine's own
    // gauge, read from its /metrics, is what saturates it here.
    let queue = "queue:\n  max_in_flight: 100\n  max_kv_usage: 0.05\n  engine_poll_ms: 50\n";
    let gw = gateway::start(fleet, &["e0"], "prefix_aware", queue).await;
    let mut long = ask(&document("a long answer", 250), "Write a long story.");
    long["max_tokens"] = json!(96);
    long["ignore_eos"] = json!(true);
    let first = {
        let gw_url = gw.url("/v1/chat/completions");
        let body = long.clone();
        tokio::spawn(async move { engines::post_json(&gw_url, None, &body).await.0 })
    };
    // The engine's own reading, as the gateway parses it: its KV cache in
    // use (waiting requests aside: max_waiting is set out of reach here).
    let inst = gw.instances().remove(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !inst.engine_saturated(u64::MAX, 0.05) {
        assert!(
            Instant::now() < deadline,
            "the engine never reported its cache in use"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = fleet.engines[0].metrics_text().await;
    assert!(kvgate::fleet::engine_load::parse(&text).is_some(), "{text}");
    // A second request now waits in the gateway, and is served once the
    // first has finished and freed its blocks.
    let second = {
        let gw_url = gw.url("/v1/chat/completions");
        let body = ask(&document("a second question", 100), "Say hi.");
        tokio::spawn(async move { engines::post_json(&gw_url, None, &body).await.0 })
    };
    let queue = &gw
        .state
        .runtime
        .load()
        .endpoint("chat")
        .unwrap()
        .queue
        .clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue.is_empty() {
        assert!(Instant::now() < deadline, "the second request did not wait");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(second.await.unwrap(), 200);
    assert!(queue.is_empty());
}
