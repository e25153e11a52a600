//! `kv_aware` as a client sees it, against stand-in vLLM publishers speaking
//! vLLM's exact frames (`kv_frames`): a prefix an instance got from elsewhere
//! attracts its traffic, an eviction moves it, gaps are replayed, restarts
//! reset, a silent publisher falls back, and replicas agree (tenants and
//! tiers: `kv_tiers`).

use std::time::Duration;

use kvgate_tokenize::PromptTokenizer;
use serde_json::{Value, json};

use super::cache_aware::{at, explain, send};
use super::kv_frames::{Encoding, Publisher};
use crate::common::*;

const KV_MODEL: &str = "cache-model";

pub fn tokenizer_path() -> String {
    format!(
        "{}/fixtures/smollm2/tokenizer.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

pub fn tokens(body: &Value) -> Vec<u32> {
    let tok = PromptTokenizer::load(&tokenizer_path(), None).unwrap();
    tok.chat(body, usize::MAX).unwrap().ids
}

/// A `kv_aware` endpoint `kv` over upstreams `u0…`, each with its publisher
/// (or none where `pubs` has fewer), plus `routing:` lines and top-level YAML.
pub fn kv_yaml(ups: &[Upstream], pubs: &[Publisher], routing: &[&str], top: &str) -> String {
    let list: String = ups
        .iter()
        .enumerate()
        .map(|(i, u)| match pubs.get(i) {
            Some(p) => format!(
                "      - {{ id: \"u{i}\", url: \"{}\", kv_events: \"{}\", kv_replay: \"{}\" }}\n",
                u.url(),
                p.events_url,
                p.replay_url
            ),
            None => format!("      - {{ id: \"u{i}\", url: \"{}\" }}\n", u.url()),
        })
        .collect();
    let routing: String = routing.iter().map(|l| format!("      {l}\n")).collect();
    format!(
        "server:\n  max_body_bytes: 262144\nendpoints:\n  - name: kv\n    models: [\"{KV_MODEL}\"]\n    instances:\n{list}    routing:\n      strategy: kv_aware\n      block_size: 16\n      tokenizer: \"{}\"\n{routing}{top}",
        tokenizer_path()
    )
}

pub async fn upstreams(n: usize) -> Vec<Upstream> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Upstream::start(&format!("u{i}"), Mode::Json).await);
    }
    v
}

pub async fn publishers(n: usize, enc: Encoding) -> Vec<Publisher> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(Publisher::start(enc).await);
    }
    v
}

pub fn batches(gw: &Gateway, i: usize) -> u64 {
    let rt = gw.state.runtime.load_full();
    let inst = &rt.endpoint("kv").unwrap().instances[i];
    inst.kv_feed().map_or(0, |s| {
        s.feed
            .counters
            .batches
            .load(std::sync::atomic::Ordering::Relaxed)
    })
}

/// Whether gateway `gw` is catching up on publisher `i` (first contact).
pub fn replaying(gw: &Gateway, i: usize) -> bool {
    let rt = gw.state.runtime.load_full();
    let inst = &rt.endpoint("kv").unwrap().instances[i];
    inst.kv_feed().is_some_and(|s| {
        s.feed.trust(std::time::Instant::now()) == kvgate::kv_events::Trust::Replaying
    })
}

/// Publish empty batches until each gateway hears each publisher and has
/// caught up on its history: a SUB that just connected misses what was
/// published before its subscription arrived.
pub async fn subscribed(gws: &[&Gateway], pubs: &mut [Publisher]) {
    for (i, p) in pubs.iter_mut().enumerate() {
        for round in 0.. {
            p.send(vec![]).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            if gws.iter().all(|g| batches(g, i) > 0 && !replaying(g, i)) {
                break;
            }
            assert!(round < 500, "gateway never heard publisher {i}");
        }
    }
}

/// Poll `explain` until `check` holds, for up to 10 s.
pub async fn explained(
    gw: &Gateway,
    key: Option<&str>,
    body: &Value,
    check: impl Fn(&Value) -> bool,
) -> Value {
    for _ in 0..500 {
        let e = explain(gw, key, body).await;
        if check(&e) {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "explanation never matched: {}",
        explain(gw, key, body).await
    );
}

pub fn chat(topic: &str) -> Value {
    let system =
        format!("You are the {topic} assistant. Answer with care and cite sources. ").repeat(30);
    json!({"model": KV_MODEL, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": format!("What about {topic}?")}
    ]})
}

/// An instance other than the one an idle, cold fleet would pick.
pub async fn not_the_cold_choice(gw: &Gateway, key: Option<&str>, body: &Value, n: usize) -> usize {
    let e = explain(gw, key, body).await;
    assert_eq!(e["reason"], "cold", "{e}");
    let cold = e["chosen"].as_str().unwrap().to_owned();
    (0..n).find(|i| format!("u{i}") != cold).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_an_instance_got_elsewhere_attracts_its_traffic_and_an_eviction_moves_it() {
    for enc in [Encoding::Array, Encoding::Map] {
        let ups = upstreams(3).await;
        let mut pubs = publishers(3, enc).await;
        let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
        subscribed(&[&gw], &mut pubs).await;
        let body = chat(&format!("{enc:?} astronomy"));
        let ids = tokens(&body);
        let blocks = ids.len() / 16;
        assert!(blocks >= 20, "{blocks} blocks");
        // A request that bypassed the gateway left the prefix on `holder`.
        let holder = not_the_cold_choice(&gw, None, &body, 3).await;
        let stored = pubs[holder].stored(1000, None, &ids, 16, None);
        pubs[holder].send(vec![stored]).await;
        let id = format!("u{holder}");
        let e = explained(&gw, None, &body, |e| e["chosen"] == id.as_str()).await;
        assert_eq!(e["reason"], "cache_hit", "{e}");
        assert_eq!(at(&e, &id)["source"], "events");
        assert_eq!(at(&e, &id)["held_prefix_blocks"], blocks as u64);
        let (status, by, _) = send(&gw, None, &body).await;
        assert_eq!((status, by.as_str()), (200, id.as_str()), "{enc:?}");

        // Evicted there (vLLM reports it), now held by another: traffic follows.
        let other = (holder + 1) % 3;
        let hs: Vec<u64> = (1000..1000 + blocks as u64).collect();
        let removed = pubs[holder].removed(&hs);
        pubs[holder].send(vec![removed]).await;
        let stored = pubs[other].stored(5000, None, &ids, 16, None);
        pubs[other].send(vec![stored]).await;
        let id = format!("u{other}");
        explained(&gw, None, &body, |e| e["chosen"] == id.as_str()).await;
        let (_, by, _) = send(&gw, None, &body).await;
        assert_eq!(by, id, "{enc:?}: the eviction did not move the prefix");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_replayed_and_a_restart_resets() {
    let ups = upstreams(2).await;
    let mut pubs = publishers(2, Encoding::Map).await;
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let body = chat("geology");
    let ids = tokens(&body);
    let holder = not_the_cold_choice(&gw, None, &body, 2).await;
    let id = format!("u{holder}");
    // The batch that stores the prefix never arrives; the next one does.
    let stored = pubs[holder].stored(77, None, &ids, 16, None);
    pubs[holder].batch(vec![stored], false).await;
    pubs[holder].send(vec![]).await;
    let e = explained(&gw, None, &body, |e| e["chosen"] == id.as_str()).await;
    let ev = &at(&e, &id)["kv_events"];
    assert_eq!(ev["gaps"], 1, "{ev}");
    assert!(ev["replays"].as_u64().unwrap() >= 1, "{ev}");
    assert_eq!(ev["state"], "events");

    // A restarted vLLM numbers from 0 again and holds nothing.
    pubs[holder].restart();
    pubs[holder].send(vec![]).await;
    let e = explained(&gw, None, &body, |e| e["reason"] == "cold").await;
    assert!(at(&e, &id)["kv_events"]["resets"].as_u64().unwrap() >= 1);
    assert_eq!(at(&e, &id)["held_prefix_blocks"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_publisher_falls_back_to_the_approximate_index_without_failing_requests() {
    let ups = upstreams(3).await;
    // u2 has no publisher at all.
    let mut pubs = publishers(2, Encoding::Array).await;
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &["kv_events_silence_ms: 300"], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let e = explain(&gw, None, &chat("x")).await;
    assert_eq!(at(&e, "u2")["kv_events"]["state"], "not_configured");
    assert_eq!(at(&e, "u2")["source"], "approximate");
    // Requests reach instances whose publishers then say nothing.
    for topic in ["botany", "zoology", "ecology", "mycology"] {
        let (status, _, _) = send(&gw, None, &chat(topic)).await;
        assert_eq!(status, 200);
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let e = explain(&gw, None, &chat("botany")).await;
    let silent: Vec<&Value> = e["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kv_events"]["state"] == "silent")
        .collect();
    assert!(!silent.is_empty(), "{e}");
    assert!(silent.iter().all(|i| i["source"] == "approximate"));
    // The fallback still knows where botany went: the approximate index.
    let (status, by, _) = send(&gw, None, &chat("botany")).await;
    assert_eq!(status, 200);
    assert_eq!(e["chosen"], by.as_str());
    let fell_back =
        super::cache_aware::metric(&gw, "kvgate_kv_fallback_total", &["reason=\"silent\""]).await;
    assert!(fell_back >= 1.0);
    let not_configured = super::cache_aware::metric(
        &gw,
        "kvgate_kv_fallback_total",
        &["reason=\"not_configured\""],
    )
    .await;
    assert!(not_configured >= 1.0);
    // Events flowing again restore trust.
    for p in &mut pubs {
        p.send(vec![]).await;
    }
    explained(&gw, None, &chat("botany"), |e| {
        at(e, "u0")["kv_events"]["state"] == "events"
            && at(e, "u1")["kv_events"]["state"] == "events"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_the_same_publishers_agree() {
    let ups = upstreams(4).await;
    let mut pubs = publishers(4, Encoding::Map).await;
    let yaml = kv_yaml(&ups, &pubs, &[], "");
    let (g1, g2) = (Gateway::start(&yaml).await, Gateway::start(&yaml).await);
    subscribed(&[&g1, &g2], &mut pubs).await;
    let body = chat("oceanography");
    let ids = tokens(&body);
    let holder = not_the_cold_choice(&g1, None, &body, 4).await;
    let stored = pubs[holder].stored(9, None, &ids, 16, None);
    pubs[holder].send(vec![stored]).await;
    let id = format!("u{holder}");
    for g in [&g1, &g2] {
        explained(g, None, &body, |e| e["chosen"] == id.as_str()).await;
        assert_eq!(send(g, None, &body).await.1, id);
    }
    // Cold prompts too: the same choice on each replica.
    for topic in 0..12 {
        let b = chat(&format!("topic {topic}"));
        let (c1, c2) = (explain(&g1, None, &b).await, explain(&g2, None, &b).await);
        assert_eq!(c1["chosen"], c2["chosen"], "topic {topic}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_of_another_size_than_block_size_are_dropped_not_matched() {
    let ups = upstreams(2).await;
    let mut pubs = publishers(2, Encoding::Array).await;
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let body = chat("metallurgy");
    let ids = tokens(&body);
    // vLLM started with --block-size 32 against routing.block_size 16.
    let stored = pubs[1].stored(1, None, &ids, 32, None);
    pubs[1].send(vec![stored]).await;
    let e = explained(&gw, None, &body, |e| {
        at(e, "u1")["kv_events"]["dropped"].as_u64() > Some(0)
    })
    .await;
    assert_eq!(at(&e, "u1")["held_prefix_blocks"], 0);
    assert_eq!(at(&e, "u1")["kv_events"]["held_blocks"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heard_mid_stream_with_history_gone_an_instance_is_partial_until_it_settles() {
    let ups = upstreams(2).await;
    let mut pubs = publishers(2, Encoding::Map).await;
    // u1's engine has been running: batches 0..5 went out before the gateway
    // started, and its replay buffer no longer holds the first three.
    for _ in 0..5 {
        pubs[1].send(vec![]).await;
    }
    pubs[1].forget_before(3);
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &["kv_events_silence_ms: 400"], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let body = chat("cartography");
    let e = explain(&gw, None, &body).await;
    assert_eq!(at(&e, "u1")["kv_events"]["state"], "partial", "{e}");
    assert_eq!(at(&e, "u1")["source"], "approximate");
    assert_eq!(
        at(&e, "u0")["kv_events"]["state"],
        "events",
        "u0 was heard from batch 0"
    );
    // Nothing orphaned for a silence window: complete again.
    explained(&gw, None, &body, |e| {
        at(e, "u1")["kv_events"]["state"] == "events"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_the_tokenizer_cannot_take_is_routed_approximately_never_refused() {
    let ups = upstreams(2).await;
    let mut pubs = publishers(2, Encoding::Map).await;
    // A tiktoken encoding with no chat template: chat bodies cannot be rendered.
    let yaml = kv_yaml(&ups, &pubs, &[], "").replace(
        &format!("tokenizer: \"{}\"", tokenizer_path()),
        "tokenizer: \"tiktoken:o200k_base\"",
    );
    let gw = Gateway::start(&yaml).await;
    subscribed(&[&gw], &mut pubs).await;
    let untokenized = |text: String| {
        text.lines()
            .find_map(|l| l.strip_prefix("kvgate_kv_untokenized_total "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let before = untokenized(gw.metrics().await);
    let (status, _, _) = send(&gw, None, &chat("numismatics")).await;
    assert_eq!(status, 200);
    let e = explain(&gw, None, &chat("numismatics")).await;
    assert!(e["engine_blocks"].is_null(), "{e}");
    assert_eq!(at(&e, "u0")["source"], "approximate");
    let after = untokenized(gw.metrics().await);
    assert!(after > before, "{before} -> {after}");
}
