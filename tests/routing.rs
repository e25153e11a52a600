//! Routing as a client sees it: affinity, canonical equality, partitions,
//! overflow, key movement and failover, through the real gateway and real
//! upstreams on ephemeral ports.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

mod common;

#[path = "routing/cache_aware.rs"]
mod cache_aware;
#[path = "routing/cache_index.rs"]
mod cache_index;
#[path = "routing/kv_aware.rs"]
mod kv_aware;
#[path = "routing/kv_frames.rs"]
mod kv_frames;
#[path = "routing/kv_libzmq.rs"]
mod kv_libzmq;
#[path = "routing/kv_restart.rs"]
mod kv_restart;
#[path = "routing/kv_sim.rs"]
mod kv_sim;
#[path = "routing/kv_tiers.rs"]
mod kv_tiers;
#[path = "routing/pace.rs"]
mod pace;
#[path = "routing/regimes.rs"]
mod regimes;
#[path = "routing/sessions.rs"]
mod sessions;
#[path = "routing/units.rs"]
mod units;
#[path = "routing/warmup.rs"]
mod warmup;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::json;

const MODEL: &str = "test-model";

/// `n` upstreams behind a prefix-aware gateway.
async fn prefix_fleet(n: usize, mode: Mode, threshold: usize) -> (Vec<Upstream>, Gateway) {
    let ups = fleet(n, mode).await;
    let gw = Gateway::start(&config(
        MODEL,
        &ups.iter().collect::<Vec<_>>(),
        "prefix_aware",
        threshold,
    ))
    .await;
    (ups, gw)
}

async fn fleet(n: usize, mode: Mode) -> Vec<Upstream> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Upstream::start(&format!("u{i}"), mode.clone()).await);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_stick_to_one_instance_and_topics_spread() {
    let (_ups, gw) = prefix_fleet(3, Mode::Json, 10).await;
    let mut placed: HashMap<usize, HashSet<String>> = HashMap::new();
    for topic in 0..12 {
        for q in 0..4 {
            let body = chat_body(
                MODEL,
                &system_prompt(topic),
                &format!("question {q}"),
                false,
            );
            let resp = gw.chat(&body).await;
            assert_eq!(resp.status(), 200);
            placed.entry(topic).or_default().insert(served_by(&resp));
        }
    }
    for (topic, where_) in &placed {
        assert_eq!(where_.len(), 1, "topic {topic} was split across {where_:?}");
    }
    let used: HashSet<&String> = placed.values().flatten().collect();
    assert!(used.len() >= 2, "12 topics all landed on {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_serialisations_of_one_body_route_equally() {
    let (ups, gw) = prefix_fleet(3, Mode::Json, 10).await;
    for doc in 0..4 {
        let prompt = format!("Document {doc}: ").repeat(120);
        let forms = [
            format!(
                r#"{{"inputs":"{prompt}","parameters":{{"max_new_tokens":64,"temperature":0.5}}}}"#
            ),
            format!(
                r#"{{"parameters":{{"temperature":0.5,"max_new_tokens":64}},"inputs":"{prompt}"}}"#
            ),
            format!(
                "{{\n  \"inputs\": \"{prompt}\",\n  \"parameters\": {{\n    \"max_new_tokens\": 64,\n    \"temperature\": 0.5\n  }}\n}}"
            ),
            format!(
                "{{ \"parameters\" : {{ \"temperature\" : 5e-1 , \"max_new_tokens\" : 64.0 }} , \"inputs\" : \"{prompt}\" }}"
            ),
            format!(
                "\t{{\"inputs\":\"{}\",\r\n\"parameters\":{{\"max_new_tokens\":6.4e1,\"temperature\":0.50}}}}  ",
                prompt.replace('D', "\\u0044")
            ),
            format!(
                "{{\"parameters\":{{\"max_new_tokens\":64,\"temperature\":0.5}},\n\n\n\"inputs\":\"{prompt}\"}}\n"
            ),
        ];
        let mut servers = HashSet::new();
        for body in &forms {
            let resp = client()
                .post(gw.url("/endpoints/chat/invocations"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{body}");
            servers.insert(served_by(&resp));
        }
        assert_eq!(
            servers.len(),
            1,
            "document {doc}: six serialisations went to {servers:?}"
        );
    }
    // The upstream saw each client's own bytes, on /invocations.
    let all: Vec<Seen> = ups.iter().flat_map(|u| u.seen()).collect();
    assert_eq!(all.len(), 24);
    assert!(all.iter().all(|s| s.path == "/invocations"));
    assert!(
        all.iter().any(|s| s.body.starts_with(b"\t{")),
        "original bytes were not forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_keys_spread_one_prefix_and_each_key_sticks() {
    let (_ups, gw) = prefix_fleet(3, Mode::Json, 10).await;
    let system = system_prompt(1);
    let mut by_key: HashMap<String, HashSet<String>> = HashMap::new();
    for k in 0..16 {
        for q in 0..3 {
            let mut body = chat_body(MODEL, &system, &format!("q{q}"), false);
            body["prompt_cache_key"] = json!(format!("user-{k}"));
            let resp = gw.chat(&body).await;
            by_key
                .entry(format!("user-{k}"))
                .or_default()
                .insert(served_by(&resp));
        }
    }
    for (k, s) in &by_key {
        assert_eq!(s.len(), 1, "{k} split over {s:?}");
    }
    let used: HashSet<&String> = by_key.values().flatten().collect();
    assert!(
        used.len() >= 2,
        "16 partitions of one prefix all on {used:?}"
    );

    // The header partitions the same way and is validated.
    let mut header_servers = HashSet::new();
    for _ in 0..3 {
        let resp = client()
            .post(gw.url("/endpoints/chat/invocations"))
            .header("x-amzn-sagemaker-prefix-aware-id", "session-42")
            .body(r#"{"inputs":"same"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        header_servers.insert(served_by(&resp));
    }
    assert_eq!(header_servers.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_preferred_instance_overflows_at_the_threshold() {
    let threshold = 2;
    let (ups, gw) = prefix_fleet(3, Mode::Delay(Duration::from_secs(2)), threshold).await;
    let body = chat_body(MODEL, &system_prompt(7), "same question", false);
    let mut tasks = Vec::new();
    for i in 0..5 {
        let url = gw.url("/v1/chat/completions");
        let bytes = serde_json::to_vec(&body).unwrap();
        tasks.push(tokio::spawn(async move {
            let r = client()
                .post(url)
                .header("content-type", "application/json")
                .body(bytes)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), served_by(&r))
        }));
        // Dispatch one at a time so each decision sees the previous one's slot.
        let rt = gw.state.runtime.load_full();
        let ep = rt.endpoint("chat").unwrap().clone();
        eventually("request dispatched", || {
            ep.instances.iter().map(|i| i.in_flight()).sum::<usize>() == i + 1
        })
        .await;
    }
    let mut served: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        let (status, by) = t.await.unwrap();
        assert_eq!(status, 200);
        *served.entry(by).or_default() += 1;
    }
    let peaks: Vec<usize> = ups
        .iter()
        .map(|u| u.state.peak.load(Ordering::SeqCst))
        .collect();
    assert!(
        peaks.iter().all(|&p| p <= threshold),
        "an instance exceeded the threshold: {peaks:?}"
    );
    assert_eq!(served.values().sum::<usize>(), 5);
    assert!(
        served.len() >= 3,
        "5 requests at threshold 2 should use all 3 instances: {served:?}"
    );
    // All done: nothing leaked.
    let rt = gw.state.runtime.load_full();
    let ep = rt.endpoint("chat").unwrap().clone();
    eventually("in-flight back to 0", || {
        ep.instances.iter().all(|i| i.in_flight() == 0)
    })
    .await;
}

async fn placements(gw: &Gateway, prefixes: usize) -> Vec<String> {
    let mut out = Vec::new();
    for p in 0..prefixes {
        let body = chat_body(MODEL, &system_prompt(1000 + p), "q", false);
        out.push(served_by(&gw.chat(&body).await));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_or_removing_an_instance_moves_only_its_share() {
    let ups = fleet(5, Mode::Json).await;
    let four: Vec<&Upstream> = ups[..4].iter().collect();
    let five: Vec<&Upstream> = ups.iter().collect();
    let n = 200;
    let before = placements(
        &Gateway::start(&config(MODEL, &four, "prefix_aware", 10)).await,
        n,
    )
    .await;
    let added = placements(
        &Gateway::start(&config(MODEL, &five, "prefix_aware", 10)).await,
        n,
    )
    .await;
    let mut moved = 0;
    for (b, a) in before.iter().zip(&added) {
        if b != a {
            assert_eq!(
                a, "u4",
                "a prefix moved between two old instances: {b} -> {a}"
            );
            moved += 1;
        }
    }
    // Ideal 1/5 of 200 = 40; allow a wide band.
    assert!(
        (15..=70).contains(&moved),
        "adding 1 of 5 moved {moved} of {n}"
    );

    // Remove u0: only what u0 held moves.
    let without: Vec<&Upstream> = ups[1..4].iter().collect();
    let removed = placements(
        &Gateway::start(&config(MODEL, &without, "prefix_aware", 10)).await,
        n,
    )
    .await;
    for (b, r) in before.iter().zip(&removed) {
        if b != "u0" {
            assert_eq!(b, r, "a prefix not on u0 moved");
        } else {
            assert_ne!(r, "u0");
        }
    }
    // A restart (a fresh gateway, same config) changes nothing.
    let again = placements(
        &Gateway::start(&config(MODEL, &four, "prefix_aware", 10)).await,
        n,
    )
    .await;
    assert_eq!(before, again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instance_is_routed_around() {
    let dead = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    }; // listener dropped: connections are refused
    let live = fleet(2, Mode::Json).await;
    let yaml = config(MODEL, &live.iter().collect::<Vec<_>>(), "prefix_aware", 10).replace(
        "    instances:\n",
        &format!("    instances:\n      - url: \"http://{dead}\"\n"),
    );
    let gw = Gateway::start(&yaml).await;
    for p in 0..30 {
        let resp = gw
            .chat(&chat_body(MODEL, &system_prompt(p), "q", false))
            .await;
        assert_eq!(resp.status(), 200, "prefix {p}");
    }
    assert_eq!(live.iter().map(|u| u.hits()).sum::<usize>(), 30);
    let rt = gw.state.runtime.load_full();
    let ep = rt.endpoint("chat").unwrap();
    let dead_inst = ep
        .instances
        .iter()
        .find(|i| i.url.ends_with(&dead.port().to_string()))
        .unwrap();
    assert!(
        !dead_inst.available(),
        "the dead instance should be cooling down"
    );
    assert!(ep.instances.iter().all(|i| i.in_flight() == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_instances_down_is_a_502_in_openai_shape() {
    let addr = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let yaml = format!(
        "endpoints:\n  - name: chat\n    models: [\"{MODEL}\"]\n    instances:\n      - url: \"http://{addr}\"\n"
    );
    let gw = Gateway::start(&yaml).await;
    let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert!(
        matches!(resp.status().as_u16(), 502 | 503),
        "{}",
        resp.status()
    );
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "server_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could take the request"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_503_fails_over_but_last_answer_passes_through() {
    let (ups, gw) = prefix_fleet(2, Mode::Status(503), 10).await;
    let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(
        ups[0].hits() + ups[1].hits(),
        2,
        "both instances should have been tried"
    );
    ups[1].set_mode(Mode::Json);
    ups[0].set_mode(Mode::Status(503));
    for p in 0..6 {
        let resp = gw
            .chat(&chat_body(MODEL, &system_prompt(p), "q", false))
            .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(served_by(&resp), "u1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_answers_is_ejected_after_three_timeouts() {
    let hung = Upstream::start("hung", Mode::Hold).await;
    let ok = Upstream::start("ok", Mode::Json).await;
    let yaml = config(MODEL, &[&hung, &ok], "round_robin", 10)
        .replace("server:\n", "server:\n  timeouts: { first_byte_ms: 300 }\n");
    let gw = Gateway::start(&yaml).await;
    let mut statuses = Vec::new();
    for q in 0..10 {
        let resp = gw
            .chat(&chat_body(MODEL, "s", &format!("q{q}"), false))
            .await;
        statuses.push(resp.status().as_u16());
    }
    // Round robin sends every other request to the hung instance until its
    // third timeout in a row cools it down; after that only `ok` answers.
    assert_eq!(
        statuses.iter().filter(|&&s| s == 504).count(),
        3,
        "{statuses:?}"
    );
    assert!(statuses[6..].iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(hung.hits(), 3);
    gw.drained().await;
}
