//! The Anthropic Messages API over HTTP: answers, usage against the prefix
//! cache (shared with chat), Anthropic's SSE, tool use, count_tokens, errors
//! in Anthropic's shape, and a stream's client leaving.

mod common;

use common::*;
use serde_json::{Value, json};

fn messages_body(text: &str, extra: Value) -> Value {
    let mut body = json!({"model": "m", "max_tokens": 3,
                          "messages": [{"role": "user", "content": text}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// `(event, data)` of each Anthropic SSE event.
#[expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper: a failed unwrap is a failed test"
)]
fn anthropic_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (event, data) = e
                .strip_prefix("event: ")
                .and_then(|e| e.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("not an Anthropic SSE event: {e:?}"));
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], event, "{e}");
            (event.to_owned(), data)
        })
        .collect()
}

#[tokio::test]
async fn a_message_answer_counts_cache_reads_shared_with_chat() {
    let sim = start(cfg()).await;
    let doc = text(1, 200);
    // The same conversation as chat first: the Messages request hits its blocks.
    let chat = chat_body(&doc, json!({"max_tokens": 1}));
    assert_eq!(
        post(&sim, "/v1/chat/completions", &chat).await.status(),
        200
    );
    let resp = post(&sim, "/v1/messages", &messages_body(&doc, json!({}))).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], "msg_t-1");
    assert_eq!(
        (&v["type"], &v["role"], &v["model"]),
        (&json!("message"), &json!("assistant"), &json!("m"))
    );
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": " the kv is"}])
    );
    assert_eq!(
        (&v["stop_reason"], &v["stop_sequence"]),
        (&json!("max_tokens"), &Value::Null)
    );
    // "<|user|>\n" + 800 bytes + "\n<|assistant|>\n" = 824 bytes = 206 tokens; 12 blocks cached.
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 206 - 192, "output_tokens": 3, "cache_read_input_tokens": 192})
    );
    let n: Value = post(
        &sim,
        "/v1/messages/count_tokens",
        &messages_body(&doc, json!({})),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        n,
        json!({"input_tokens": 206, "context_management": {"original_input_tokens": 206}})
    );
    assert_eq!(
        sim.server.stats().requests,
        2,
        "count_tokens generates nothing"
    );
}

#[tokio::test]
async fn a_streamed_message_is_anthropic_sse() {
    let sim = start(cfg()).await;
    let body = messages_body("stream me", json!({"stream": true, "system": "be brief"}));
    let (_, text) = stream(&sim, "/v1/messages", &body).await;
    let ev = anthropic_events(&text);
    let kinds: Vec<&str> = ev.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    let start = &ev[0].1["message"];
    assert_eq!(start["id"], "msg_t-0");
    assert_eq!(
        (&start["role"], &start["content"]),
        (&json!("assistant"), &json!([]))
    );
    assert_eq!(start["usage"]["output_tokens"], 0);
    assert_eq!(
        ev[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let words: Vec<&str> = ev[2..5]
        .iter()
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(words, [" the", " kv", " is"]);
    let delta = &ev[6].1;
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "max_tokens", "stop_sequence": null})
    );
    assert_eq!(delta["usage"]["output_tokens"], 3);
    assert_eq!(
        delta["usage"]["input_tokens"],
        start["usage"]["input_tokens"]
    );
}

#[tokio::test]
async fn tools_get_a_tool_use_answer_until_a_tool_result_comes_back() {
    let sim = start(cfg()).await;
    let tools = json!({"tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]});
    let ask = messages_body("Weather in Paris?", tools.clone());
    let v: Value = post(&sim, "/v1/messages", &ask).await.json().await.unwrap();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        v["content"],
        json!([{"type": "tool_use", "id": "toolu_t-0", "name": "get_weather", "input": {}}])
    );
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let (_, text) = stream(&sim, "/v1/messages", &streamed).await;
    let ev = anthropic_events(&text);
    assert_eq!(ev[1].1["content_block"]["type"], "tool_use");
    assert_eq!(
        ev[2].1["delta"],
        json!({"type": "input_json_delta", "partial_json": "{}"})
    );
    assert_eq!(ev[4].1["delta"]["stop_reason"], "tool_use");

    let mut answered = ask;
    answered["messages"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": v["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_t-0", "content": "sunny"}]},
    ]);
    let v: Value = post(&sim, "/v1/messages", &answered)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&v["stop_reason"], &v["content"][0]["type"]),
        (&json!("max_tokens"), &json!("text"))
    );
}

#[tokio::test]
async fn malformed_messages_get_anthropic_shaped_400s() {
    let sim = start(cfg()).await;
    let no_max = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let bad_block = messages_body(
        "x",
        json!({"messages": [{"role": "user", "content": [{"type": "video"}]}]}),
    );
    for (path, body) in [
        ("/v1/messages", no_max),
        ("/v1/messages", bad_block),
        ("/v1/messages/count_tokens", json!({"model": "m"})),
    ] {
        let resp = post(&sim, path, &body).await;
        assert_eq!(resp.status(), 400, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(
            (&v["type"], &v["error"]["type"]),
            (&json!("error"), &json!("invalid_request_error")),
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let resp = client()
        .post(format!("{}/v1/messages", sim.url()))
        .header("content-type", "application/json")
        .body(&b"{\"model\": \"\xff\"}"[..])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(sim.server.stats().requests, 0, "nothing reached the engine");
}

#[tokio::test]
async fn dropping_a_message_stream_aborts_it() {
    let sim = start(common::cfg_with(|c| c.max_running = 1)).await;
    let server = sim.server.clone();
    let body = messages_body(
        &text(30, 100),
        json!({"max_tokens": 100_000, "stream": true}),
    );
    let mut resp = post(&sim, "/v1/messages", &body).await;
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"event: message_start\n"));
    drop(resp);
    eventually("abort", || server.stats().aborted == 1).await;
    eventually("idle", || server.stats().running == 0).await;
    assert_eq!(server.stats().kv_blocks_in_use, 0);
}
