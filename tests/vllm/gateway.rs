//! A gateway in front of the shared engines, and what a test asks of it:
//! chat through it, the engine's own usage back, and `explain`'s view of
//! what each engine holds.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::engines::{BLOCK, Fleet, MODEL};
use crate::common::Gateway;

/// Two API-key tenants (`printf %s foo | sha256sum`, and `bar`), salted.
pub const TENANTS: &str = r#"auth:
  mode: api_key
  api_keys:
    - tenant: tenant-a
      sha256: "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
    - tenant: tenant-b
      sha256: "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9"
isolation:
  upstream_cache_salt: true
  salt_secret: "a-test-salt-secret-of-32-bytes-or-more"
"#;
pub const KEY_A: &str = "foo";
pub const KEY_B: &str = "bar";

/// A gateway over the engines named in `ids`, with `strategy`; `kv_aware`
/// follows their events and tokenizes with the model folder (its chat
/// template from `chat_template.jinja`, as transformers saves it).
pub async fn start(fleet: &Fleet, ids: &[&str], strategy: &str, extra: &str) -> Gateway {
    let kv = strategy == "kv_aware";
    let instances: String = ids
        .iter()
        .map(|id| {
            let e = fleet.engine(id);
            if kv {
                format!(
                    "      - {{ id: {id}, url: \"{}\", kv_events: \"{}\", kv_replay: \"{}\" }}\n",
                    e.url, e.events, e.replay
                )
            } else {
                format!("      - {{ id: {id}, url: \"{}\" }}\n", e.url)
            }
        })
        .collect();
    let tokenizer = if kv {
        format!(
            "      tokenizer: \"{}\"\n      block_size: {BLOCK}\n",
            fleet.tokenizer().display()
        )
    } else {
        String::new()
    };
    Gateway::start(&format!(
        "endpoints:\n  - name: chat\n    models: [\"{MODEL}\"]\n    instances:\n{instances}    routing:\n      strategy: {strategy}\n      prefix_length: 1024\n{tokenizer}{extra}"
    ))
    .await
}

/// A document of about `words` words that no other test shares.
pub fn document(topic: &str, words: usize) -> String {
    let vocab = [
        "river", "signal", "copper", "lantern", "harvest", "orbit", "granite", "velvet", "compass",
        "meadow", "thunder", "cipher", "harbor", "ember", "glacier", "saffron",
    ];
    let mut h = topic
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mut out = format!("Report on {topic}.");
    for i in 0..words {
        h = h
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push(' ');
        out.push_str(vocab[(h >> 60) as usize]);
        if i % 12 == 11 {
            out.push('.');
        }
    }
    out
}

/// A chat body: `doc` as the system prompt, one question, a one-token answer.
pub fn ask(doc: &str, question: &str) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": doc},
            {"role": "user", "content": question}
        ],
        "max_tokens": 1,
        "temperature": 0
    })
}

/// POST a chat body through the gateway as `key`'s tenant (none: anonymous);
/// the engine's answer, which must be a 200.
pub async fn chat(gw: &Gateway, key: Option<&str>, body: &Value) -> Value {
    let (status, v) = super::engines::post_json(&gw.url("/v1/chat/completions"), key, body).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`.
pub fn usage(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

/// `explain` of a chat body as `key`'s tenant.
pub async fn explain(gw: &Gateway, key: Option<&str>, body: &Value) -> Value {
    let r = gw.explain("/v1/chat/completions", key, body).await;
    assert_eq!(r.status(), 200);
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

/// Leading blocks of `body`'s prompt engine `id` holds, by its events.
pub fn held(v: &Value, id: &str) -> u64 {
    v["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["id"] == id))
        .and_then(|i| i["held_prefix_blocks"].as_u64())
        .unwrap_or(0)
}

/// Poll `explain` until `ok` holds of it (60 s: events follow within a
/// step, but a CPU engine's step can be slow).
pub async fn until(
    gw: &Gateway,
    key: Option<&str>,
    body: &Value,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = explain(gw, key, body).await;
        if ok(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Full blocks of a prompt of `tokens` tokens that an engine stores.
pub fn full_blocks(tokens: u64) -> u64 {
    tokens / BLOCK as u64
}
