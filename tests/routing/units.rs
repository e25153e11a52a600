//! Tokens a character learned from the engines' answers (`kvgate_routing::
//! units`), over real HTTP: in front of engines that count 2 characters a
//! token (0.5 tokens a character, as code or identifiers tokenize), the
//! gateway learns the ratio from `usage.prompt_tokens` within a few answers,
//! `explain` shows it and what it rests on, an answer with absurd usage does
//! not move it, and a decision the 4-characters guess gets wrong follows:
//! a holder with two requests queued keeps a 2,000-character prompt that the
//! guess, counting it as 500 tokens, sent to recompute elsewhere, and the
//! index holds half the blocks the guess sized it for.

use super::cache_aware::{explain, ids, text, upstreams, yaml};
use crate::common::*;
use serde_json::{Value, json};

/// 1,000 prompt tokens whatever the prompt: 0.5 a character at 2,000 characters.
const HALF: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001}}"#;
/// Usage no tokenizer could give for such a prompt.
const ABSURD: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":900000,"completion_tokens":1,"total_tokens":900001}}"#;

/// A prompt of about 2,000 canonical characters, unique to `seed`.
fn prompt(seed: u64) -> Value {
    let t = text(seed, 500);
    json!({"model": super::cache_aware::MODEL, "messages": [{"role": "user", "content": &t[..1990]}]})
}

async fn send(gw: &Gateway, body: &Value) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_learns_two_characters_a_token_and_routes_by_it() {
    let ups = upstreams(2, Mode::Raw(200, "application/json", HALF)).await;
    let gw = Gateway::start(&yaml("units", &ids(&ups), &[], "")).await;
    let doc = prompt(1);

    // Before any answer: the guess, 4 characters a token.
    let v = explain(&gw, None, &doc).await;
    assert_eq!(
        v["units"]["source"], "default (4 characters a token)",
        "{v}"
    );
    let guessed = v["prompt_tokens_estimate"].as_u64().unwrap();
    assert!((495..=505).contains(&guessed), "{v}");
    let capacity =
        |v: &Value| super::cache_aware::num(v, &ups[0].state.name, "index_capacity_blocks");
    let guessed_capacity = capacity(&v);

    // The document lands on a holder; two more requests for it queue there.
    assert_eq!(send(&gw, &doc).await.status(), 200);
    let holder = explain(&gw, None, &doc).await["chosen"]
        .as_str()
        .unwrap()
        .to_owned();
    let h = ups.iter().find(|u| u.state.name == holder).unwrap();
    h.set_mode(Mode::Hold);
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (url, body) = (
                gw.url("/v1/chat/completions"),
                serde_json::to_vec(&doc).unwrap(),
            );
            tokio::spawn(async move {
                client()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
            })
        })
        .collect();
    eventually("both wait on the holder", || h.seen().len() == 3).await;
    // As 500 tokens, recomputing it elsewhere beats the holder's queue.
    let v = explain(&gw, None, &doc).await;
    assert_eq!(v["reason"], "cache_spread", "{v}");
    assert_ne!(v["chosen"], holder.as_str(), "{v}");

    // Answers teach the engine's ratio; an absurd one is refused.
    let other = ups.iter().find(|u| u.state.name != holder).unwrap();
    other.set_mode(Mode::Raw(200, "application/json", ABSURD));
    assert_eq!(send(&gw, &prompt(99)).await.status(), 200);
    other.set_mode(Mode::Raw(200, "application/json", HALF));
    for seed in 2..9 {
        assert_eq!(send(&gw, &prompt(seed)).await.status(), 200);
    }
    let v = explain(&gw, None, &doc).await;
    let units = &v["units"];
    assert_eq!(units["source"], "learned from answers' usage", "{v}");
    assert_eq!(units["answers"], 8, "{v}");
    assert_eq!(units["refused"], 1, "{v}");
    let ratio = units["tokens_per_char"].as_f64().unwrap();
    assert!((0.49..=0.51).contains(&ratio), "{v}");
    let learned = v["prompt_tokens_estimate"].as_u64().unwrap();
    assert!((990..=1010).contains(&learned), "{v}");
    // The same cache in tokens holds half as many blocks of text this
    // dense: the index shrinks to what the engine really holds.
    assert_eq!(capacity(&v), guessed_capacity / 2, "{v}");
    // As 1,000 tokens, the holder's queue is worth waiting for.
    assert_eq!(v["reason"], "cache_hit", "{v}");
    assert_eq!(v["chosen"], holder.as_str(), "{v}");
    let m = gw.metrics().await;
    assert!(
        m.contains("kvgate_usage_refused_total{endpoint=\"units\"} 1"),
        "{m}"
    );
    for j in held {
        j.abort();
    }
}
