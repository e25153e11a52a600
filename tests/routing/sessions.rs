//! A Messages session under `longest_prefix`, as an agent sends it
//! (`metadata.user_id`, a shared system prompt, a history growing by tool
//! results): it starts on its ring instance, and stays there past the
//! balance cap until that instance's queue outweighs recomputing the session.

use serde_json::{Value, json};

use super::cache_aware::{MODEL, at, ids, text, upstreams, yaml};
use crate::common::*;

const ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"cache-model","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":2}}"#;

/// A Messages body: `system`, then each (question, answer), then `last`.
fn body(system: &str, session: &str, turns: &[(String, String)], last: &str) -> Value {
    let mut messages = Vec::new();
    for (q, a) in turns {
        messages.push(json!({"role": "user", "content": q}));
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": a}]}));
    }
    messages.push(json!({"role": "user", "content": last}));
    json!({
        "model": MODEL, "max_tokens": 16, "system": system,
        "metadata": {"user_id": session}, "messages": messages,
    })
}

async fn explain(gw: &Gateway, b: &Value) -> Value {
    let r = gw.explain("/v1/messages", None, b).await;
    assert_eq!(r.status(), 200);
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

fn post(gw: &Gateway, b: &Value) -> reqwest::RequestBuilder {
    client()
        .post(gw.url("/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(serde_json::to_vec(b).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_session_stays_past_the_cap_until_its_queue_outweighs_it() {
    let ups = upstreams(3, Mode::Raw(200, "application/json", ANSWER)).await;
    let gw = Gateway::start(&yaml("agents", &ids(&ups), &[], "")).await;
    let system = text(1, 1500);
    // Six turns of one session: a task, then answers and tool results of
    // ~100 tokens each, every one sent once the last has been answered.
    let mut turns: Vec<(String, String)> = Vec::new();
    let mut last = text(2, 100);
    let mut home = String::new();
    for t in 0..6u64 {
        let b = body(&system, "session-1", &turns, &last);
        let v = explain(&gw, &b).await;
        let r = post(&gw, &b).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let by = served_by(&r);
        if t == 0 {
            home = by;
        } else {
            assert_eq!(v["reason"], "cache_hit", "turn {t}: {v}");
            assert_eq!(by, home, "turn {t} moved: {v}");
        }
        turns.push((last, text(10 + t, 50)));
        last = text(20 + t, 60);
    }
    let h = ups.iter().position(|u| u.state.name == home).unwrap();
    // Its instance stops answering; three more turns wait there. With 3 in
    // flight on 3 instances the cap is ⌈1.5 · 4 / 3⌉ = 2, and its limit 3.
    *ups[h].state.mode.lock().unwrap() = Mode::Hold;
    let mut held = Vec::new();
    let mut send_held = |b: &Value| held.push(tokio::spawn(post(&gw, b).send()));
    for k in 0..3u64 {
        send_held(&body(&system, "session-1", &turns, &text(30 + k, 20)));
        eventually("a turn held at home", || {
            ups[h]
                .state
                .active
                .load(std::sync::atomic::Ordering::SeqCst)
                == k as usize + 1
        })
        .await;
    }
    // The session's next turn still goes home, over the cap: recomputing its
    // ~2,300 tokens elsewhere costs more than the three turns decoding there.
    let next = body(&system, "session-1", &turns, &text(40, 20));
    let v = explain(&gw, &next).await;
    assert_eq!(at(&v, &home)["in_flight"], 3, "{v}");
    assert_eq!(
        (v["chosen"].as_str(), v["reason"].as_str()),
        (Some(home.as_str()), Some("cache_hit")),
        "{v}"
    );
    let opening = v["opening_tokens_estimate"].as_u64().unwrap();
    assert!(
        (1400..1700).contains(&opening),
        "the system prompt's ~1,500 tokens: {v}"
    );
    // A new session over the same system prompt starts on its own ring
    // instance under the caps (not the full one), which then holds the
    // system prompt too.
    let fresh = body(&system, "session-2", &[], &text(50, 100));
    let v = explain(&gw, &fresh).await;
    assert_eq!(v["opening_tokens_estimate"], Value::Null, "{v}");
    assert_ne!(v["chosen"].as_str(), Some(home.as_str()), "{v}");
    // (`affinity` when it is not also the cheapest of the rest.)
    assert!(
        ["affinity", "cache_spread"].contains(&v["reason"].as_str().unwrap()),
        "{v}"
    );
    let spread_to = v["chosen"].as_str().unwrap().to_owned();
    let r = post(&gw, &fresh).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), served_by(&r)),
        (200, spread_to.clone())
    );
    // More of the session's turns wait at home, each adding what its decoding
    // costs the others there, until recomputing the session's own ~800
    // tokens where the system prompt is now held too costs less.
    let mut stayed = 3;
    let left = loop {
        let b = body(&system, "session-1", &turns, &text(100 + stayed, 20));
        let v = explain(&gw, &b).await;
        if v["chosen"] != home.as_str() {
            break v;
        }
        assert_eq!(v["reason"], "cache_hit", "{v}");
        stayed += 1;
        send_held(&b);
        eventually("a turn held at home", || {
            ups[h]
                .state
                .active
                .load(std::sync::atomic::Ordering::SeqCst)
                == stayed as usize
        })
        .await;
        assert!(stayed < 64, "never left a queue of {stayed}: {v}");
    };
    assert_eq!(left["reason"], "cache_spread", "{left}");
    let chosen = left["chosen"].as_str().unwrap();
    let (home_cost, there) = (
        at(&left, &home)["cost"].as_u64().unwrap(),
        at(&left, chosen),
    );
    assert!(
        at(&left, &home)["queued_tokens"].as_u64().unwrap()
            > there["uncached_tokens"].as_u64().unwrap()
                - at(&left, &home)["uncached_tokens"].as_u64().unwrap(),
        "left for a queue shorter than the recompute: {left}"
    );
    assert!(there["cost"].as_u64().unwrap() < home_cost, "{left}");
    assert!(stayed > 4, "left after {stayed} turns queued: {left}");
    assert_eq!(chosen, spread_to, "{left}");
    for t in held {
        t.abort();
    }
}
