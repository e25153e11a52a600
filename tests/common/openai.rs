//! The test upstream's answers to the Responses and embeddings APIs, shaped as
//! vLLM's: a response is stored on the instance that made it (ids
//! `resp_<instance>_<n>`), and a follow-up naming one it does not hold is a
//! 404, as vLLM answers.

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::UpstreamState;

fn reply(state: &UpstreamState, status: StatusCode, ct: &str, body: String) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ct)
        .header("x-instance", state.name.as_str())
        .body(Body::from(body))
        .unwrap()
}

fn not_found(state: &UpstreamState, id: &str) -> Response {
    let e = json!({"error": {"message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": null, "code": 404}});
    reply(
        state,
        StatusCode::NOT_FOUND,
        "application/json",
        e.to_string(),
    )
}

fn response_object(state: &UpstreamState, id: &str, prev: &Value, model: &Value) -> Value {
    json!({
        "id": id, "object": "response", "created_at": 1, "model": model, "status": "completed",
        "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": format!("hi from {}", state.name), "annotations": []}]}],
        "previous_response_id": prev, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13}
    })
}

/// An answer for the OpenAI routes the test upstream plays vLLM for, if `path` is one.
pub fn answer(state: &UpstreamState, method: &str, path: &str, body: &Bytes) -> Option<Response> {
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if path == "/v1/embeddings" {
        let n = match &req["input"] {
            Value::Array(a) if a.first().is_some_and(|v| !v.is_number()) => a.len(),
            _ => 1,
        };
        let data: Vec<Value> = (0..n)
            .map(|i| json!({"object": "embedding", "index": i, "embedding": [0.25, -0.5, 1.0]}))
            .collect();
        let v = json!({"object": "list", "data": data, "model": req["model"], "id": "embd-1",
                       "usage": {"prompt_tokens": 3, "total_tokens": 3}});
        return Some(reply(
            state,
            StatusCode::OK,
            "application/json",
            v.to_string(),
        ));
    }
    if path == "/v1/responses" && method == "POST" {
        let prev = &req["previous_response_id"];
        if let Some(p) = prev.as_str()
            && !state.responses.lock().unwrap().contains(&p.to_owned())
        {
            return Some(not_found(state, p));
        }
        let id = {
            let mut stored = state.responses.lock().unwrap();
            let id = format!("resp_{}_{}", state.name, stored.len());
            stored.push(id.clone());
            id
        };
        let obj = response_object(state, &id, prev, &req["model"]);
        if req["stream"] != json!(true) {
            return Some(reply(
                state,
                StatusCode::OK,
                "application/json",
                obj.to_string(),
            ));
        }
        let mut created = obj.clone();
        created["status"] = json!("in_progress");
        created["output"] = json!([]);
        created["usage"] = Value::Null;
        let text = format!("hi from {}", state.name);
        let item = json!({"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []});
        let part = json!({"type": "output_text", "text": "", "annotations": []});
        let done_part = json!({"type": "output_text", "text": text, "annotations": []});
        let ev = |seq: u64, kind: &str, mut extra: Value| {
            extra["type"] = json!(kind);
            extra["sequence_number"] = json!(seq);
            (kind.to_owned(), extra)
        };
        let at = json!({"item_id": "msg_1", "output_index": 0, "content_index": 0});
        let with = |mut base: Value, k: &str, v: Value| {
            base[k] = v;
            base
        };
        let events = [
            ev(0, "response.created", json!({"response": created.clone()})),
            ev(1, "response.in_progress", json!({"response": created})),
            ev(
                2,
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ),
            ev(
                3,
                "response.content_part.added",
                with(at.clone(), "part", part),
            ),
            ev(
                4,
                "response.output_text.delta",
                with(
                    with(at.clone(), "delta", json!(text)),
                    "logprobs",
                    json!([]),
                ),
            ),
            ev(
                5,
                "response.output_text.done",
                with(with(at.clone(), "text", json!(text)), "logprobs", json!([])),
            ),
            ev(6, "response.content_part.done", with(at, "part", done_part)),
            ev(
                7,
                "response.output_item.done",
                json!({"output_index": 0, "item": obj["output"][0]}),
            ),
            ev(8, "response.completed", json!({"response": obj})),
        ];
        let sse: String = events
            .iter()
            .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
            .collect();
        return Some(reply(state, StatusCode::OK, "text/event-stream", sse));
    }
    let rest = path.strip_prefix("/v1/responses/")?;
    let (id, cancel) = match rest.strip_suffix("/cancel") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    if !state.responses.lock().unwrap().contains(&id.to_owned()) {
        return Some(not_found(state, id));
    }
    let mut obj = response_object(state, id, &Value::Null, &json!("m"));
    if cancel {
        obj["status"] = json!("cancelled");
    }
    Some(reply(
        state,
        StatusCode::OK,
        "application/json",
        obj.to_string(),
    ))
}
