//! Warm-up on scale-out: an instance a reload adds is sent the endpoint's
//! hottest prefixes (`max_tokens: 1` each) before it takes traffic, counted
//! in metrics, and then holds them.

use serde_json::Value;

use super::cache_aware::{chat, explain, ids, matched, metric, reload, text, upstreams, yaml};
use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_instance_is_warmed_with_the_hottest_prefixes_first() {
    let ups = upstreams(3, Mode::Json).await;
    let all = ids(&ups);
    let routing = ["warmup: { prefixes: 2 }"];
    let gw = Gateway::start(&yaml("warm", &all[..2], &routing, "")).await;
    // Two hot prompts (five requests each), one cold one.
    let hot: Vec<String> = (0..2).map(|k| text(100 + k, 600)).collect();
    for _ in 0..5 {
        for h in &hot {
            assert_eq!(gw.chat(&chat(h)).await.status(), 200);
        }
    }
    assert_eq!(gw.chat(&chat(&text(999, 600))).await.status(), 200);

    reload(&gw, &yaml("warm", &all, &routing, ""));
    eventually("u2 warmed with both hot prompts", || ups[2].hits() == 2).await;
    let seen: Vec<Value> = ups[2]
        .seen()
        .iter()
        .map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect();
    for v in &seen {
        assert_eq!(v["max_tokens"], 1, "{v}");
        assert!(v.get("stream").is_none());
        let content = v["messages"][0]["content"].as_str().unwrap();
        assert!(
            hot.iter().any(|h| h == content),
            "warmed a prompt that is not hot"
        );
    }
    let ok = metric(
        &gw,
        "kvgate_warmup_requests_total",
        &["endpoint=\"warm\"", "result=\"ok\""],
    )
    .await;
    assert_eq!(ok, 2.0);
    // Once warm it takes traffic, and the gateway knows what it holds.
    let rt = gw.state.runtime.load_full();
    let inst = rt.endpoint("warm").unwrap().instances[2].clone();
    eventually("u2 out of warm-up", || !inst.is_warming()).await;
    for h in &hot {
        let e = explain(&gw, None, &chat(h)).await;
        assert!(matched(&e, "u2") > 0, "{e}");
    }
}
