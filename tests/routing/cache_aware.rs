//! Cache-aware placement (`longest_prefix`) as a client sees it: conversations
//! stick, hot prefixes spread and then hit (simulated vLLM fleet), cold ones
//! balance, and the modelled capacity evicts. Also the helpers that
//! `cache_index` shares: configs, requests, explanations, metrics.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use kvgate_sim::{SimConfig, SimHandle};
use serde_json::{Value, json};

use crate::common::*;

pub const MODEL: &str = "cache-model";

/// `n` test upstreams named (and given instance ids) `u0`, `u1`, …
pub async fn upstreams(n: usize, mode: Mode) -> Vec<Upstream> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Upstream::start(&format!("u{i}"), mode.clone()).await);
    }
    v
}

pub fn ids(ups: &[Upstream]) -> Vec<(String, String)> {
    ups.iter()
        .map(|u| (u.state.name.clone(), u.url()))
        .collect()
}

/// A `longest_prefix` endpoint `name` over `(id, url)` instances, with extra
/// `routing:` lines and extra top-level YAML.
pub fn yaml(name: &str, instances: &[(String, String)], routing: &[&str], top: &str) -> String {
    let list: String = instances
        .iter()
        .map(|(id, url)| format!("      - {{ id: \"{id}\", url: \"{url}\" }}\n"))
        .collect();
    let routing: String = routing.iter().map(|l| format!("      {l}\n")).collect();
    format!(
        "server:\n  max_body_bytes: 262144\n  failover_cooldown_ms: 60000\nendpoints:\n  - name: {name}\n    models: [\"{MODEL}\"]\n    instances:\n{list}    routing:\n      strategy: longest_prefix\n{routing}{top}"
    )
}

pub fn reload(gw: &Gateway, yaml: &str) {
    gw.state
        .reload(kvgate::Config::from_yaml(&with_admin(yaml)).unwrap())
        .unwrap();
}

/// `tokens` tokens (4 characters each) of text unique to `seed` from its first character.
pub fn text(seed: u64, tokens: usize) -> String {
    kvgate_sim::block_text(seed, tokens)
}

pub fn chat(content: &str) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}]})
}

pub fn request(
    gw: &Gateway,
    path: &str,
    key: Option<&str>,
    body: &Value,
) -> reqwest::RequestBuilder {
    let r = client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap());
    match key {
        Some(k) => r.bearer_auth(k),
        None => r,
    }
}

/// Send a chat completion; status, the upstream that answered, and the body.
pub async fn send(gw: &Gateway, key: Option<&str>, body: &Value) -> (u16, String, Value) {
    let resp = request(gw, "/v1/chat/completions", key, body)
        .send()
        .await
        .unwrap();
    let (status, by) = (resp.status().as_u16(), served_by(&resp));
    let v = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or(Value::Null);
    (status, by, v)
}

pub async fn explain(gw: &Gateway, key: Option<&str>, body: &Value) -> Value {
    let resp = gw.explain("/v1/chat/completions", key, body).await;
    assert_eq!(resp.status(), 200);
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

/// One instance's entry in an explanation (`null` if it is not there).
pub fn at<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["id"] == id))
        .unwrap_or(&Value::Null)
}

pub fn num(v: &Value, id: &str, field: &str) -> u64 {
    at(v, id)[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} for {id}: {v}"))
}

pub fn matched(v: &Value, id: &str) -> u64 {
    num(v, id, "matched_blocks")
}

/// The sum of a metric's samples whose labels contain every one of `labels`.
pub async fn metric(gw: &Gateway, name: &str, labels: &[&str]) -> f64 {
    let text = gw.metrics().await;
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
        .filter(|l| labels.iter().all(|s| l.contains(s)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `kvgate_routing_decisions_total` for one endpoint and outcome, all instances.
pub async fn decisions(gw: &Gateway, endpoint: &str, outcome: &str) -> f64 {
    let labels = [
        format!("endpoint=\"{endpoint}\""),
        format!("outcome=\"{outcome}\""),
    ];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    metric(gw, "kvgate_routing_decisions_total", &labels).await
}

pub async fn drained(gw: &Gateway, endpoint: &str) {
    let rt = gw.state.runtime.load_full();
    let ep = rt.endpoint(endpoint).unwrap().clone();
    eventually("in-flight back to 0", || {
        ep.instances.iter().all(|i| i.in_flight() == 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_turns_stay_where_the_first_turn_landed() {
    let ups = upstreams(3, Mode::Json).await;
    let gw = Gateway::start(&yaml("convs", &ids(&ups), &[], "")).await;
    let mut convs: Vec<Vec<Value>> = (0..8)
        .map(|c| vec![json!({"role": "user", "content": text(100 + c, 150)})])
        .collect();
    let mut home: Vec<String> = Vec::new();
    let mut blocks = vec![0; convs.len()]; // each conversation's chain so far
    for turn in 0..5u64 {
        for (c, messages) in convs.iter_mut().enumerate() {
            let body = json!({"model": MODEL, "messages": messages});
            let v = explain(&gw, None, &body).await;
            if turn > 0 {
                // All of the previous turn is held where it went, and only there.
                assert_eq!(
                    v["reason"], "cache_hit",
                    "conversation {c} turn {turn}: {v}"
                );
                assert_eq!(v["chosen"], home[c].as_str(), "{v}");
                let held: Vec<u64> = ids(&ups).iter().map(|(id, _)| matched(&v, id)).collect();
                assert_eq!(held.iter().sum::<u64>(), blocks[c], "{v}");
                assert_eq!(matched(&v, &home[c]), blocks[c], "{v}");
            }
            blocks[c] = v["chain_blocks"].as_u64().unwrap();
            let (status, by, _) = send(&gw, None, &body).await;
            assert_eq!(status, 200);
            if turn == 0 {
                home.push(by);
            } else {
                assert_eq!(by, home[c], "conversation {c} moved at turn {turn}");
            }
            let seed = 1000 + 10 * c as u64 + turn;
            messages.push(json!({"role": "assistant", "content": text(seed, 40)}));
            messages.push(json!({"role": "user", "content": text(seed + 5000, 30)}));
        }
    }
    let used: HashSet<&String> = home.iter().collect();
    assert!(used.len() >= 2, "8 conversations all went to {used:?}");
    let cold = decisions(&gw, "convs", "cold").await;
    assert_eq!(
        (cold, decisions(&gw, "convs", "cache_hit").await),
        (8.0, 32.0)
    );
    // First turns matched nothing; every later turn over a quarter of its prompt.
    let (ratio, ep) = (
        "kvgate_routing_matched_prefix_ratio_bucket",
        "endpoint=\"convs\"",
    );
    assert_eq!(metric(&gw, ratio, &[ep, "le=\"0\""]).await, 8.0);
    assert_eq!(metric(&gw, ratio, &[ep, "le=\"0.25\""]).await, 8.0);
    assert_eq!(metric(&gw, ratio, &[ep, "le=\"+Inf\""]).await, 40.0);
}

/// Send `bodies` one at a time, each once the previous one has reached its
/// simulated instance; which instance took each, and each answer.
async fn one_by_one(gw: &Gateway, sims: &[SimHandle], bodies: Vec<Value>) -> Vec<(usize, Value)> {
    let counts = || -> Vec<u64> { sims.iter().map(|s| s.server.stats().requests).collect() };
    let mut pending = Vec::new();
    for body in bodies {
        let before = counts();
        let req = request(gw, "/v1/chat/completions", None, &body);
        let answer = tokio::spawn(async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap()
        });
        let total: u64 = before.iter().sum();
        eventually("request reached a simulated instance", || {
            counts().iter().sum::<u64>() == total + 1
        })
        .await;
        let now = counts();
        pending.push((
            (0..sims.len()).find(|&i| now[i] > before[i]).unwrap(),
            answer,
        ));
    }
    let mut out = Vec::new();
    for (took, answer) in pending {
        out.push((took, answer.await.unwrap()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_prefix_spreads_under_load_and_every_holder_then_hits() {
    // Real time, slow prefill: a cold 4,000-token prompt takes 1.6 s, a warm one a step.
    let cfg = SimConfig {
        name: "sim".into(),
        model: MODEL.into(),
        block_size: 16,
        cache_blocks: 20_000,
        prefill_tokens_per_s: 2_500.0,
        inter_token_latency: Duration::from_millis(10),
        max_running: 16,
        time_scale: 1.0,
        ..SimConfig::default()
    };
    let sims = kvgate_sim::spawn_fleet(&cfg, 3).await.unwrap();
    let ids: Vec<(String, String)> = (0..3).map(|i| (format!("s{i}"), sims[i].url())).collect();
    let gw = Gateway::start(&yaml("hot", &ids, &[], "")).await;
    let system = text(7, 4_000);
    let body = |q: usize| {
        json!({"model": MODEL, "max_tokens": 40, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": format!("question {q}")}]})
    };
    let burst = one_by_one(&gw, &sims, (0..6).map(body).collect()).await;
    let holders: HashSet<usize> = burst.iter().map(|(i, _)| *i).collect();
    assert!(
        holders.len() >= 2,
        "six concurrent requests all on {holders:?}"
    );
    assert!(decisions(&gw, "hot", "cache_spread").await >= 1.0);
    drained(&gw, "hot").await;

    // Later requests spread over the holders only, and every one of them hits.
    let cached_before: Vec<u64> = sims
        .iter()
        .map(|s| s.server.stats().cached_tokens)
        .collect();
    let later = one_by_one(&gw, &sims, (6..6 + 2 * holders.len()).map(body).collect()).await;
    let served: HashSet<usize> = later.iter().map(|(i, _)| *i).collect();
    assert_eq!(served, holders, "later requests left the holders");
    for (i, answer) in &later {
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert!(cached.unwrap_or(0) >= 3_900, "s{i} answered {answer}");
    }
    for &i in &holders {
        assert!(
            sims[i].server.stats().cached_tokens > cached_before[i],
            "s{i} never hit"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_prefixes_balance_over_every_instance() {
    let ups = upstreams(4, Mode::Json).await;
    let gw = Gateway::start(&yaml("cold", &ids(&ups), &[], "")).await;
    let mut one_by_one: HashMap<String, usize> = HashMap::new();
    for p in 0..120 {
        let (status, by, _) = send(&gw, None, &chat(&text(5000 + p, 100))).await;
        assert_eq!(status, 200);
        *one_by_one.entry(by).or_default() += 1;
    }
    assert_eq!(one_by_one.len(), 4, "{one_by_one:?}");
    assert!(
        one_by_one.values().all(|&n| (12..=60).contains(&n)),
        "{one_by_one:?}"
    );

    // All at once on slow upstreams: placed by load, so close to even.
    for u in &ups {
        u.set_mode(Mode::Delay(Duration::from_millis(800)));
    }
    let tasks: Vec<_> = (0..40)
        .map(|p| {
            let (url, body) = (gw.url("/v1/chat/completions"), chat(&text(9000 + p, 100)));
            let req = client().post(url).body(serde_json::to_vec(&body).unwrap());
            tokio::spawn(async move {
                let r = req.send().await.unwrap();
                (r.status().as_u16(), served_by(&r))
            })
        })
        .collect();
    let mut at_once: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let (status, by) = t.await.unwrap();
        assert_eq!(status, 200);
        *at_once.entry(by).or_default() += 1;
    }
    assert!(
        at_once.len() == 4 && at_once.values().all(|&n| (5..=20).contains(&n)),
        "40 concurrent cold prompts over 4 instances: {at_once:?}"
    );
    assert_eq!(decisions(&gw, "cold", "cold").await, 160.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_prefix_no_longer_attracts_traffic() {
    let ups = upstreams(2, Mode::Json).await;
    // 1,024 tokens at 64 tokens a block: 16 blocks per instance.
    let routing = ["cache_tokens: 1024", "block_chars: 256"];
    let gw = Gateway::start(&yaml("tiny", &ids(&ups), &routing, "")).await;
    let old = chat(&text(1, 640));
    let (_, home, _) = send(&gw, None, &old).await;
    let v = explain(&gw, None, &old).await;
    let blocks = v["chain_blocks"].as_u64().unwrap();
    assert!((9..=11).contains(&blocks), "{v}");
    assert_eq!(
        (v["reason"].as_str(), v["chosen"].as_str()),
        (Some("cache_hit"), Some(&*home))
    );
    assert_eq!(
        (matched(&v, &home), num(&v, &home, "index_capacity_blocks")),
        (blocks, 16)
    );
    let mut pushed = 0; // blocks of newer prompts sent to `home`
    for p in 0..60 {
        let newer = chat(&text(100 + p, 640));
        let newer_blocks = explain(&gw, None, &newer).await["chain_blocks"]
            .as_u64()
            .unwrap();
        let (status, by, _) = send(&gw, None, &newer).await;
        assert_eq!(status, 200);
        if by == home {
            pushed += newer_blocks;
        }
        let v = explain(&gw, None, &old).await;
        for (id, _) in ids(&ups) {
            assert!(num(&v, &id, "index_blocks") <= 16, "{v}");
        }
        // The oldest blocks go first, and the old chain's tail before its head.
        assert_eq!(
            matched(&v, &home),
            blocks.min(16u64.saturating_sub(pushed)),
            "{v}"
        );
        if pushed >= 16 {
            assert_eq!(v["reason"], "cold", "an evicted prefix still attracts: {v}");
            return;
        }
    }
    panic!("60 new prompts never pushed the old one out of {home}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_prompt_is_charged_the_wait_it_adds_beside_a_request_still_waiting() {
    let ups = upstreams(2, Mode::Delay(Duration::from_secs(3))).await;
    let gw = Gateway::start(&yaml("beside", &ids(&ups), &[], "")).await;
    // A request whose answer has not begun: it waits for its first byte.
    let req = request(&gw, "/v1/chat/completions", None, &chat(&text(1, 400)));
    let held = tokio::spawn(async move { req.send().await.unwrap().status().as_u16() });
    let cold = chat(&text(2, 800));
    let mut v = Value::Null;
    for _ in 0..200 {
        v = explain(&gw, None, &cold).await;
        if ["u0", "u1"].iter().any(|id| num(&v, id, "waiting") == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (busy, quiet) = if num(&v, "u0", "waiting") == 1 {
        ("u0", "u1")
    } else {
        ("u1", "u0")
    };
    assert_eq!(num(&v, busy, "waiting"), 1, "{v}");
    // Its prefill would hold the waiting request back by all of its own.
    assert!(num(&v, busy, "uncached_tokens") >= 700, "{v}");
    assert_eq!(
        num(&v, busy, "delayed_tokens"),
        num(&v, busy, "uncached_tokens"),
        "{v}"
    );
    assert_eq!(
        (num(&v, quiet, "waiting"), num(&v, quiet, "delayed_tokens")),
        (0, 0),
        "{v}"
    );
    assert_eq!(v["chosen"], quiet, "{v}");
    // Once the answer has come, nothing waits and nothing is delayed.
    assert_eq!(held.await.unwrap(), 200);
    let v = explain(&gw, None, &cold).await;
    for id in ["u0", "u1"] {
        assert_eq!(
            (num(&v, id, "waiting"), num(&v, id, "delayed_tokens")),
            (0, 0),
            "{v}"
        );
    }
}
