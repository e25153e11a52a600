//! Anthropic's Messages API in front of vLLM: an agent's turn (system
//! blocks, tools, a tool call and its result) keyed with the very tokens the
//! engine renders for it, so `kv_aware` follows the engine's own events for
//! agent traffic; its stream passed through whole; its usage (input tokens
//! net of the cached ones) read right; `count_tokens` answered.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::engines::{self, MODEL};
use super::gateway::{self, document, full_blocks, held};
use crate::common::{Gateway, client};

fn agent_turn(question: &str) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 1,
        "temperature": 0,
        "metadata": {"user_id": "session-7"},
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=93a1f;"},
            {"type": "text", "text": document("an agent's system prompt", 90)},
        ],
        "tools": [{
            "name": "read_file",
            "description": "Read a file of the repository.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
        }],
        "messages": [
            {"role": "user", "content": "Why does the build fail?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me read the build script."},
                {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "build.rs"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": document("a build script", 80)}]}
            ]},
            {"role": "assistant", "content": "The script reads an unset variable."},
            {"role": "user", "content": [{"type": "text", "text": question}]}
        ]
    })
}

async fn post(gw: &Gateway, path: &str, body: &Value) -> (u16, Value, String) {
    let r = client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_turn_is_keyed_with_vllms_own_tokens_and_followed_on_its_events() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let body = agent_turn("And how do I fix it?");
    // The engine's tokens for this request: the same conversion and template
    // as its /v1/messages path (vLLM's render endpoint).
    let rendered = fleet.engines[0].post("/v1/messages/render", &body).await;
    let theirs: Vec<u32> = rendered["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let tokenizer =
        kvgate_tokenize::PromptTokenizer::load(&fleet.tokenizer().display().to_string(), None)
            .unwrap();
    let chat = kvgate::anthropic::chat::as_chat(&body, tokenizer.requires_system_first()).unwrap();
    let ours = tokenizer.chat(&chat, 1 << 20).unwrap();
    assert_eq!(
        ours.ids, theirs,
        "the gateway renders the Messages request unlike vLLM"
    );

    // count_tokens through the gateway: the engine's count.
    let (status, counted, text) = post(&gw, "/v1/messages/count_tokens", &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(counted["input_tokens"].as_u64(), Some(theirs.len() as u64));

    // The turn through the gateway. vLLM splits the prompt Anthropic's way:
    // tokens read from cache, tokens it stored new, and the rest.
    let (status, answer, text) = post(&gw, "/v1/messages", &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(answer["type"], "message", "{answer}");
    let u = &answer["usage"];
    let prompt = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .iter()
    .map(|k| u[k].as_u64().unwrap_or(0))
    .sum::<u64>();
    assert_eq!(prompt, theirs.len() as u64, "{answer}");

    // Block by block, the engine's stored blocks match every gateway key.
    let want = full_blocks(theirs.len() as u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    let explained = loop {
        let r = gw.explain("/v1/messages", None, &body).await;
        assert_eq!(r.status(), 200);
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        if held(&v, "e0").max(held(&v, "e1")) >= want {
            break v;
        }
        assert!(Instant::now() < deadline, "blocks never matched: {v:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        explained["engine_blocks"].as_u64(),
        Some(want),
        "{explained:#}"
    );

    // The next turn streams from the engine that holds the conversation, its
    // SSE passed through whole, with most of its prompt read from cache.
    let mut next = agent_turn("Show me the patch.");
    next["stream"] = json!(true);
    let (status, _, sse) = post(&gw, "/v1/messages", &next).await;
    assert_eq!(status, 200, "{sse}");
    let events: Vec<&str> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"), "{sse}");
    assert_eq!(events.last(), Some(&"message_stop"), "{sse}");
    assert!(events.contains(&"message_delta"), "{sse}");
    // vLLM's message_start does not know the cache yet; message_delta does.
    let delta: Value = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "message_delta")
        .unwrap();
    let cached = delta["usage"]["cache_read_input_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        cached >= (want - 2) * super::engines::BLOCK as u64,
        "the follow-up turn found only {cached} cached tokens: {delta}"
    );
    // The gateway read the same: its cached-token counter grew by as much.
    let m = gw.metrics().await;
    let total: f64 = m
        .lines()
        .filter(|l| l.starts_with("kvgate_upstream_cached_tokens_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(total >= cached as f64, "{total} < {cached}: {m}");
}
