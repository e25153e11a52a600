//! Helpers shared by the HTTP test binaries: start an instance, talk to it, wait.

#![allow(dead_code, reason = "each test binary uses its own subset")]
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::time::Duration;

use kvgate_sim::{SimConfig, SimHandle, spawn};
use serde_json::{Value, json};
use tokio::time::Instant;

/// Real time, but slow enough prefill (2,500 tokens/s) that a cold 1,000-token
/// prompt takes 0.4 s while a warm one takes one 5 ms step: ratios, not wall-clock
/// limits, carry the assertions.
pub fn cfg() -> SimConfig {
    SimConfig {
        name: "t".into(),
        block_size: 16,
        cache_blocks: 10_000,
        prefill_tokens_per_s: 2_500.0,
        inter_token_latency: Duration::from_millis(5),
        max_running: 8,
        max_batched_tokens: 8_192,
        default_max_tokens: 4,
        time_scale: 1.0,
        ..SimConfig::default()
    }
}

/// [`cfg`] changed by `f`.
pub fn cfg_with(f: impl FnOnce(&mut SimConfig)) -> SimConfig {
    let mut c = cfg();
    f(&mut c);
    c
}

pub async fn start(cfg: SimConfig) -> SimHandle {
    spawn(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// `tokens` tokens of text that differ for each `seed`.
pub fn text(seed: u64, tokens: usize) -> String {
    kvgate_sim::block_text(seed, tokens)
}

/// A chat body with one user message.
pub fn chat_body(content: &str, extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

pub async fn post(sim: &SimHandle, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", sim.url()))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// A streamed request: time to first body chunk, and the whole body.
pub async fn stream(sim: &SimHandle, path: &str, body: &Value) -> (Duration, String) {
    let start = Instant::now();
    let mut resp = post(sim, path, body).await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().expect("empty stream");
    let ttft = start.elapsed();
    let mut all = String::from_utf8(first.to_vec()).unwrap();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        all.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    (ttft, all)
}

/// The JSON payloads of an SSE body, `[DONE]` as a string.
pub fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let data = e
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE event: {e:?}"));
            serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_owned()))
        })
        .collect()
}

/// `usage` of the stream's usage chunk.
pub fn stream_usage(body: &str) -> Value {
    events(body)
        .into_iter()
        .find_map(|e| e.get("usage").cloned())
        .expect("no usage chunk")
}

/// Poll `cond` every 10 ms for up to 20 s.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}
