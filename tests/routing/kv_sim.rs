//! `kv_aware` end to end against the simulated vLLM fleet publishing real KV
//! events (token ids from the same SmolLM2 tokenizer the gateway is given):
//! what one request stored attracts the next, a prefix sent around the
//! gateway is found, and the engine's evictions take it away again.

use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::{EventEncoding, HashForm, KvEventsConfig, SimConfig, SimHandle};
use kvgate_tokenize::PromptTokenizer;
use serde_json::{Value, json};

use super::cache_aware::{at, explain};
use super::kv_aware::{batches, tokenizer_path};
use crate::common::*;

const MODEL: &str = "cache-model";

async fn sims(n: usize, cache_blocks: usize) -> Vec<SimHandle> {
    let tok = Arc::new(PromptTokenizer::load(&tokenizer_path(), None).unwrap());
    let cfg = SimConfig {
        name: "sim".into(),
        model: MODEL.into(),
        cache_blocks,
        time_scale: 0.0,
        tokenizer: Some(tok),
        kv_events: Some(KvEventsConfig {
            encoding: EventEncoding::Map,
            hashes: HashForm::Bytes,
            ..KvEventsConfig::default()
        }),
        ..SimConfig::llama70b_h100_tp4()
    };
    kvgate_sim::spawn_fleet(&cfg, n).await.unwrap()
}

fn yaml(sims: &[SimHandle]) -> String {
    let list: String = sims
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "      - {{ id: \"s{i}\", url: \"{}\", kv_events: \"{}\", kv_replay: \"{}\" }}\n",
                s.url(),
                s.kv_events_endpoint().unwrap(),
                s.kv_replay_endpoint().unwrap()
            )
        })
        .collect();
    format!(
        "endpoints:\n  - name: kv\n    models: [\"{MODEL}\"]\n    instances:\n{list}    routing:\n      strategy: kv_aware\n      block_size: 16\n      tokenizer: \"{}\"\n",
        tokenizer_path()
    )
}

fn body(system: &str, q: &str) -> Value {
    json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": q}]})
}

async fn direct(sim: &SimHandle, body: &Value) {
    let r = client()
        .post(format!("{}/v1/chat/completions", sim.url()))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// Until the gateway hears each sim (its SUB misses what precedes its subscription).
async fn subscribed(gw: &Gateway, sims: &[SimHandle]) {
    for (i, s) in sims.iter().enumerate() {
        for round in 0.. {
            direct(s, &body(&format!("probe {round} ").repeat(8), "hi")).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            if batches(gw, i) > 0 {
                break;
            }
            assert!(round < 300, "never heard sim {i}");
        }
    }
}

async fn explained(gw: &Gateway, body: &Value, check: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..500 {
        let e = explain(gw, None, body).await;
        if check(&e) {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never: {}", explain(gw, None, body).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_instance_stored_attracts_the_next_request_and_its_evictions_release_it() {
    let sims = sims(3, 400).await;
    let gw = Gateway::start(&yaml(&sims)).await;
    subscribed(&gw, &sims).await;
    let system = "You are a meticulous research librarian. Cite every source. ".repeat(40);

    // One conversation through the gateway: its next turn lands where the
    // first one's blocks were reported stored, as a cache hit.
    let first = body(&system, "Where are the maps?");
    let e = explain(&gw, None, &first).await;
    let holder = e["chosen"].as_str().unwrap().to_owned();
    let r = gw.chat(&first).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let next = body(&system, "And the atlases?");
    let e = explained(&gw, &next, |e| e["reason"] == "cache_hit").await;
    assert_eq!(e["chosen"], holder.as_str());
    let held = at(&e, &holder)["held_prefix_blocks"].as_u64().unwrap();
    let expected = e["engine_blocks"].as_u64().unwrap();
    assert!(
        held + 2 >= expected && held > 20,
        "held {held} of {expected}: {e}"
    );
    let before = sims
        .iter()
        .map(|s| s.server.stats().cached_tokens)
        .sum::<u64>();
    let r = gw.chat(&next).await;
    r.bytes().await.unwrap();
    let after = sims
        .iter()
        .map(|s| s.server.stats().cached_tokens)
        .sum::<u64>();
    assert!(
        after - before >= held * 16,
        "the engine did not hit: {before} → {after}"
    );

    // A prompt sent straight to another sim (around the gateway) is found there.
    let idx = |id: &str| id[1..].parse::<usize>().unwrap();
    let other = (idx(&holder) + 1) % 3;
    let side = body(
        &"An unrelated legal brief about maritime salvage. ".repeat(40),
        "Summarise.",
    );
    direct(&sims[other], &side).await;
    let sid = format!("s{other}");
    explained(&gw, &side, |e| {
        e["chosen"] == sid.as_str() && e["reason"] == "cache_hit"
    })
    .await;

    // The engine evicts it (other prompts fill its 400-block cache) and says
    // so: the gateway no longer counts it there.
    for k in 0..12 {
        direct(
            &sims[other],
            &body(&format!("Filler document {k}. ").repeat(200), "ok"),
        )
        .await;
    }
    let e = explained(&gw, &side, |e| at(e, &sid)["held_prefix_blocks"] == 0).await;
    assert_eq!(at(&e, &sid)["source"], "events");
}
