//! The per-instance block index as a client sees it: tenants never share an
//! entry, hostile input leaves it bounded, reloads keep or drop it per
//! instance, and an attempt that reached no engine takes its chain back out.

use std::collections::HashSet;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::cache_aware::*;
use crate::common::*;

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_identical_prompts_never_share_an_index_entry() {
    let ups = upstreams(3, Mode::Json).await;
    let auth = format!(
        "auth:\n  mode: api_key\n  api_keys:\n    - {{ tenant: acme, sha256: \"{}\" }}\n    - {{ tenant: beta, sha256: \"{}\" }}\nisolation:\n  salt_secret: \"test-only-salt-secret-0123456789\"\n",
        sha256_hex("sk-acme"),
        sha256_hex("sk-beta")
    );
    let gw = Gateway::start(&yaml("tenants", &ids(&ups), &[], &auth)).await;
    let (acme, beta) = (Some("sk-acme"), Some("sk-beta"));
    let body = chat(&text(42, 800));
    let (status, acme_home, _) = send(&gw, acme, &body).await;
    assert_eq!(status, 200);
    let a = explain(&gw, acme, &body).await;
    let blocks = a["chain_blocks"].as_u64().unwrap();
    assert_eq!(
        (a["reason"].as_str(), matched(&a, &acme_home)),
        (Some("cache_hit"), blocks)
    );
    // Beta's identical prompt finds nothing of acme's, anywhere.
    let b = explain(&gw, beta, &body).await;
    assert_eq!(
        (b["tenant"].as_str(), b["reason"].as_str()),
        (Some("beta"), Some("cold")),
        "{b}"
    );
    for (id, _) in ids(&ups) {
        assert_eq!(matched(&b, &id), 0, "{b}");
    }
    let (status, beta_home, _) = send(&gw, beta, &body).await;
    assert_eq!(status, 200);
    let d = |outcome| decisions(&gw, "tenants", outcome);
    assert_eq!((d("cold").await, d("cache_hit").await), (2.0, 0.0));
    // Each tenant now hits its own entry, and only its own.
    assert_eq!(send(&gw, acme, &body).await.1, acme_home);
    assert_eq!(send(&gw, beta, &body).await.1, beta_home);
    assert_eq!(d("cache_hit").await, 2.0);
    let b = explain(&gw, beta, &body).await;
    assert_eq!(matched(&b, &beta_home), blocks);
    if beta_home != acme_home {
        assert_eq!(matched(&b, &acme_home), 0, "{b}");
    }
    // Without a key: 401, and nothing indexed.
    let total = index_total(&b);
    assert_eq!(send(&gw, None, &chat(&text(43, 800))).await.0, 401);
    assert_eq!(index_total(&explain(&gw, acme, &body).await), total);
}

fn index_total(v: &Value) -> u64 {
    v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["index_blocks"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_route_or_fail_without_harming_the_index() {
    let ups = upstreams(2, Mode::Json).await;
    let gw = Gateway::start(&yaml("hostile", &ids(&ups), &["max_prompt_blocks: 64"], "")).await;
    let probe = chat("probe");
    // A prompt near max_body_bytes (262,144): 248,000 characters, ~970 blocks, cut to 64.
    let huge = chat(&text(9, 62_000));
    assert_eq!(explain(&gw, None, &huge).await["chain_blocks"], 64);
    assert_eq!(send(&gw, None, &huge).await.0, 200);
    assert_eq!(index_total(&explain(&gw, None, &probe).await), 64);
    // Thousands of tiny messages: also at most 64 blocks.
    let tiny: Vec<Value> = (0..6000)
        .map(|i| json!({"role": "user", "content": i.to_string()}))
        .collect();
    let many = json!({"model": MODEL, "messages": tiny});
    assert!(
        explain(&gw, None, &many).await["chain_blocks"]
            .as_u64()
            .unwrap()
            <= 64
    );
    assert_eq!(send(&gw, None, &many).await.0, 200);
    let total = index_total(&explain(&gw, None, &probe).await);
    assert!((65..=128).contains(&total), "{total}");
    let gauge = metric(&gw, "kvgate_index_blocks", &["endpoint=\"hostile\""]).await;
    assert_eq!(gauge, total as f64);

    // Malformed bodies: a 4xx each, no upstream reached, nothing indexed.
    let hits = ups.iter().map(Upstream::hits).sum::<usize>();
    let m = MODEL;
    let big = format!(
        r#"{{"model":"{m}","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(300_000)
    );
    let mut bad: Vec<(&str, String)> = [
        format!(r#"{{"model":"{m}","messages":[{{"role":"#),
        format!(r#"{{"model":"{m}","messages":"hi"}}"#),
        format!(r#"{{"model":"{m}","messages":[1, 2]}}"#),
        format!(r#"{{"model":"{m}","messages":[{{"role":"user","content":5}}]}}"#),
        r#"{"messages":[{"role":"user","content":"no model"}]}"#.into(),
        r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#.into(),
        format!(r#"{{"model":"{m}","messages":[]}} trailing"#),
        big,
    ]
    .into_iter()
    .map(|b| ("application/json", b))
    .collect();
    let ok = format!(r#"{{"model":"{m}","messages":[{{"role":"user","content":"x"}}]}}"#);
    bad.push(("text/plain", ok));
    for (ct, body) in bad {
        let resp = client()
            .post(gw.url("/v1/chat/completions"))
            .header("content-type", ct)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        assert!(
            (400..500).contains(&status),
            "{status} for {}",
            &body[..body.len().min(80)]
        );
    }
    assert_eq!(ups.iter().map(Upstream::hits).sum::<usize>(), hits);
    assert_eq!(index_total(&explain(&gw, None, &probe).await), total);
    assert_eq!(send(&gw, None, &probe).await.0, 200, "still serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_what_staying_instances_hold_and_new_ones_start_empty() {
    let ups = upstreams(4, Mode::Json).await;
    let all = ids(&ups);
    let gw = Gateway::start(&yaml("reload", &all[..3], &[], "")).await;
    let mut prompts: Vec<(Value, String)> = Vec::new();
    for p in 0..60 {
        let body = chat(&text(700 + p, 300));
        let (status, by, _) = send(&gw, None, &body).await;
        assert_eq!(status, 200);
        prompts.push((body, by));
        let homes: HashSet<&String> = prompts.iter().map(|(_, h)| h).collect();
        if homes.len() == 3 && prompts.len() >= 6 {
            break;
        }
    }
    let mut before = Vec::new();
    for (body, home) in &prompts {
        let v = explain(&gw, None, body).await;
        assert!(matched(&v, home) > 0, "{v}");
        before.push(v);
    }
    let kept = |b: &Value, a: &Value| {
        for id in ["u0", "u1"] {
            assert_eq!(matched(a, id), matched(b, id), "{id} changed: {b} -> {a}");
            assert_eq!(num(a, id, "index_blocks"), num(b, id, "index_blocks"));
        }
    };
    // u2 goes: u0 and u1 keep exactly what they held.
    reload(&gw, &yaml("reload", &all[..2], &[], ""));
    for ((body, _), b) in prompts.iter().zip(&before) {
        let a = explain(&gw, None, body).await;
        assert!(at(&a, "u2").is_null(), "{a}");
        kept(b, &a);
    }
    // u2 comes back and u3 joins: both start empty; what lived on u2 is cold.
    reload(&gw, &yaml("reload", &all, &[], ""));
    for ((body, home), b) in prompts.iter().zip(&before) {
        let a = explain(&gw, None, body).await;
        for id in ["u2", "u3"] {
            assert_eq!(
                (matched(&a, id), num(&a, id, "index_blocks")),
                (0, 0),
                "{a}"
            );
        }
        kept(b, &a);
        if home == "u2" {
            assert_eq!(a["reason"], "cold", "{a}");
        }
    }
    // An id now at another URL is another instance: it starts empty too.
    let moved = vec![all[0].clone(), ("u1".to_owned(), all[3].1.clone())];
    reload(&gw, &yaml("reload", &moved, &[], ""));
    let a = explain(&gw, None, &prompts[0].0).await;
    assert_eq!(num(&a, "u1", "index_blocks"), 0, "{a}");
    assert_eq!(
        num(&a, "u0", "index_blocks"),
        num(&before[0], "u0", "index_blocks")
    );
    // A new block size makes every held hash meaningless: all cleared.
    reload(&gw, &yaml("reload", &moved, &["block_chars: 128"], ""));
    assert_eq!(index_total(&explain(&gw, None, &prompts[0].0).await), 0);
}

/// A loopback address nothing listens on: connections are refused.
async fn refused_addr() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

/// Two live upstreams and a dead instance `dead`, and a prompt the idle fleet
/// would send to `dead` first.
async fn fleet_with_dead(name: &str) -> (Vec<Upstream>, Gateway, Value) {
    let live = upstreams(2, Mode::Json).await;
    let mut instances = ids(&live);
    instances.push(("dead".into(), format!("http://{}", refused_addr().await)));
    let gw = Gateway::start(&yaml(name, &instances, &[], "")).await;
    for p in 0..200 {
        let body = chat(&text(300 + p, 200));
        if explain(&gw, None, &body).await["chosen"] == "dead" {
            return (live, gw, body);
        }
    }
    panic!("no prompt prefers the dead instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_over_and_leaves_no_chain_behind() {
    let (_live, gw, body) = fleet_with_dead("failover").await;
    let blocks = explain(&gw, None, &body).await["chain_blocks"]
        .as_u64()
        .unwrap();
    let (status, by, _) = send(&gw, None, &body).await;
    assert_eq!(status, 200);
    assert!(by.starts_with('u'), "{by}");
    let v = explain(&gw, None, &body).await;
    assert_eq!(
        (matched(&v, "dead"), num(&v, "dead", "index_blocks")),
        (0, 0),
        "{v}"
    );
    assert_eq!(at(&v, "dead")["available"], false);
    assert_eq!(
        (matched(&v, &by), v["chosen"].as_str()),
        (blocks, Some(&*by)),
        "{v}"
    );
    assert_eq!(v["reason"], "cache_hit");
    let retries = metric(
        &gw,
        "kvgate_upstream_retries_total",
        &["endpoint=\"failover\""],
    );
    assert_eq!(retries.await, 1.0);
}

/// The gauge reports what the index holds after a failed attempt is taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_gauge_follows_a_taken_back_insert() {
    let (_live, gw, body) = fleet_with_dead("gauge").await;
    assert_eq!(send(&gw, None, &body).await.0, 200);
    let v = explain(&gw, None, &body).await;
    assert_eq!(num(&v, "dead", "index_blocks"), 0);
    let labels = ["endpoint=\"gauge\"", "upstream=\"dead\""];
    assert_eq!(
        metric(&gw, "kvgate_index_blocks", &labels).await,
        0.0,
        "gauge vs {v}"
    );
}

/// A 502/503 means the instance did no work, whether or not another is tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_that_answer_503_hold_nothing_afterwards() {
    let ups = upstreams(2, Mode::Status(503)).await;
    let gw = Gateway::start(&yaml("busy", &ids(&ups), &[], "")).await;
    let body = chat(&text(77, 300));
    assert_eq!(send(&gw, None, &body).await.0, 503);
    assert_eq!(ups.iter().map(Upstream::hits).sum::<usize>(), 2);
    let v = explain(&gw, None, &body).await;
    assert_eq!(index_total(&v), 0, "{v}");
    assert_eq!(v["reason"], "cold", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_capacity_is_learned_from_vllm_cache_config_info() {
    // Two sims of different sizes; the config names no cache_tokens anywhere.
    let mut sims = Vec::new();
    for blocks in [1_000usize, 4_000] {
        let cfg = kvgate_sim::SimConfig {
            model: MODEL.into(),
            cache_blocks: blocks,
            time_scale: 0.0,
            ..kvgate_sim::SimConfig::default()
        };
        sims.extend(kvgate_sim::spawn_fleet(&cfg, 1).await.unwrap());
    }
    let ids: Vec<(String, String)> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("s{i}"), s.url()))
        .collect();
    // Beside them, an engine whose /metrics has no such gauge.
    let ups = upstreams(1, Mode::Json).await;
    let mut all = ids.clone();
    all.push(("fixed".into(), ups[0].url()));
    let gw = Gateway::start(&yaml("learn", &all, &[], "")).await;
    let capacity = |v: &Value, id: &str| num(v, id, "index_capacity_blocks");
    let body = chat(&text(3, 100));
    // 16-token blocks × N over 64-token index blocks (block_chars 256).
    let mut last = Value::Null;
    for _ in 0..500 {
        last = explain(&gw, None, &body).await;
        if capacity(&last, "s0") == 250 && capacity(&last, "s1") == 1_000 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        (capacity(&last, "s0"), capacity(&last, "s1")),
        (250, 1_000),
        "{last}"
    );
    // The plain upstream exports no gauge: the default 384,000 tokens stay.
    assert_eq!(capacity(&last, "fixed"), 6_000, "{last}");
}
