//! The demo fleet end to end: `kvgate demo`'s setup started and called, and
//! the official OpenAI Python SDK speaking to it (chat, streaming, models,
//! errors raised as the SDK's exception classes, cached tokens on a repeat).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

use std::sync::Arc;

use kvgate::demo::{DemoOptions, start_fleet};
use tokio::net::TcpListener;

async fn demo() -> (
    std::net::SocketAddr,
    kvgate::demo::Demo,
    tokio::sync::oneshot::Sender<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // 20x faster than real time keeps the test short; routing is unaffected.
    let demo = start_fleet(
        &DemoOptions {
            instances: 3,
            time_scale: 0.05,
            ..DemoOptions::default()
        },
        addr,
    )
    .await
    .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(kvgate::serve(listener, Arc::clone(&demo.state), async {
        let _ = rx.await;
    }));
    (addr, demo, tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_serves_and_routes_a_repeated_prefix_to_a_warm_instance() {
    let (addr, demo, _stop) = demo().await;
    assert!(
        kvgate::demo::banner(&demo, addr).contains(&format!("http://{addr}/v1/chat/completions"))
    );
    let body = serde_json::json!({
        "model": demo.model,
        "max_tokens": 4,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant for ACME. ".repeat(150)},
            {"role": "user", "content": "hi"}
        ]
    });
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut cached = Vec::new();
    for _ in 0..3 {
        let resp = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(cached[0], 0, "first request should be cold");
    assert!(
        cached[1] > 1000 && cached[2] > 1000,
        "repeats were not cache hits: {cached:?}"
    );
    // All three on one instance.
    let served: Vec<u64> = demo
        .fleet
        .iter()
        .map(|h| h.server.stats().requests)
        .collect();
    assert_eq!(served.iter().filter(|&&n| n > 0).count(), 1, "{served:?}");

    // The banner names the console and this run's token, and the console
    // shows these three requests: one cold, then cache hits on its instance.
    let banner = kvgate::demo::banner(&demo, addr);
    assert!(
        banner.contains(&format!("http://{addr}/console")),
        "{banner}"
    );
    assert!(banner.contains(&demo.admin_token));
    let resp = client
        .get(format!("http://{addr}/console/api/state"))
        .bearer_auth(&demo.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    let decisions = v["decisions"].as_array().unwrap();
    let reasons: Vec<&str> = decisions
        .iter()
        .map(|d| d["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["cold", "cache_hit", "cache_hit"], "{decisions:?}");
    let home = &demo.fleet[served.iter().position(|&n| n > 0).unwrap()].url();
    assert!(
        decisions.iter().all(|d| d["instance"] == home.as_str()),
        "{decisions:?}"
    );
    assert!(
        decisions[2]["cached_tokens"].as_u64().unwrap() > 1000,
        "{decisions:?}"
    );
    let instances = v["state"]["endpoints"][0]["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 3);
    let warm = instances.iter().find(|i| i["id"] == home.as_str()).unwrap();
    assert!(
        warm["hit_rate_1m"]["ratio"].as_f64().unwrap() > 0.5,
        "{warm}"
    );
    assert_eq!(warm["kv_events"]["state"], "events", "{warm}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_interop() {
    let (addr, demo, _stop) = demo().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/interop.py");
    let base = format!("http://{addr}");
    let model = demo.model.clone();
    let out = tokio::process::Command::new("python3")
        .args([script, &base, &model])
        .env("NO_PROXY", "*")
        .output()
        .await
        .expect("python3 must be installed (.ci/run installs the SDK: pip install -r tests/sdk/requirements.txt)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "SDK interop failed (is the SDK installed? pip install -r tests/sdk/requirements.txt)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.starts_with("ok"), "{stdout}");
}
