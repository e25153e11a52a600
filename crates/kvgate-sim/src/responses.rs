//! The Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`) and
//! embeddings, as vLLM serves them. A response's conversation is stored on
//! this instance only (bounded, oldest dropped first), so a follow-up naming
//! `previous_response_id` works here and is a 404 elsewhere — what makes a
//! gateway's routing of follow-ups matter. The conversation is rebuilt as vLLM
//! does: `instructions` as a system message, then the previous turns, then
//! `input`, and generated through the chat path, so a follow-up's history is a
//! cached prefix. A stream sends its opening events at once, the first token's
//! delta when it is generated and the rest at the end.

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::engine::Progress;
use crate::error::ApiError;
use crate::response_store::Store;
use crate::server::SimServer;
use crate::text::output_text;

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Response with id '{id}' not found."))
}

/// `input` as chat turns: a string is one user turn; message items keep their
/// role, with `input_text` / `output_text` parts as text.
fn turns(input: &Value) -> Result<Vec<Value>, ApiError> {
    let text = |parts: &[Value]| -> String {
        parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()
    };
    match input {
        Value::String(s) => Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => Ok(items
            .iter()
            .map(|item| {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                let content = match item.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text(parts),
                    _ => item
                        .get("output")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                };
                json!({"role": role, "content": content})
            })
            .collect()),
        _ => Err(ApiError::bad_request(
            "`input` must be a string or an array of items",
            Some("input"),
        )),
    }
}

fn object(id: &str, model: &str, prev: &Value, text: &str, usage: Value, status: &str) -> Value {
    json!({
        "id": id, "object": "response", "created_at": 0, "model": model, "status": status,
        "output": [{"id": format!("msg_{id}"), "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "previous_response_id": prev, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "usage": usage,
    })
}

fn usage(prompt: usize, p: &Progress) -> Value {
    json!({"input_tokens": prompt, "input_tokens_details": {"cached_tokens": p.cached_tokens},
           "output_tokens": p.generated, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": prompt + p.generated})
}

fn event(kind: &str, seq: usize, mut body: Value) -> String {
    body["type"] = json!(kind);
    body["sequence_number"] = json!(seq);
    format!("event: {kind}\ndata: {body}\n\n")
}

impl SimServer {
    /// `POST /v1/responses`.
    pub(crate) async fn respond(&self, body: &[u8]) -> Result<Response, ApiError> {
        let req: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))?;
        let prev = req
            .get("previous_response_id")
            .cloned()
            .unwrap_or(Value::Null);
        let mut history = Vec::new();
        if let Some(p) = prev.as_str() {
            history = self.responses.get(p).ok_or_else(|| not_found(p))?.0;
        }
        // As vLLM builds it: this request's instructions, the stored messages
        // of the previous one (its own instructions included), the new input.
        let mut messages = Vec::new();
        if let Some(i) = req.get("instructions").and_then(Value::as_str) {
            messages.push(json!({"role": "system", "content": i}));
        }
        messages.append(&mut history);
        messages.extend(turns(req.get("input").unwrap_or(&Value::Null))?);
        let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let chat = json!({
            "model": req.get("model"), "messages": &messages, "stream": stream,
            "max_tokens": req.get("max_output_tokens"), "cache_salt": req.get("cache_salt"),
        });
        let job = crate::request::parse_chat(
            &serde_json::to_vec(&chat).unwrap_or_default(),
            self.cfg.tokenizer.as_deref(),
        )?;
        let accepted = self.submit(&job)?;
        let id = accepted.meta.id.replacen("chatcmpl-", "resp_", 1);
        let model = accepted.meta.model.clone();
        let prompt = accepted.prompt_tokens;
        let mut rx = accepted.rx;
        let mut stored = messages;
        let finish = move |store: &Store, p: &Progress| {
            let text = output_text(p.generated);
            stored.push(json!({"role": "assistant", "content": text}));
            let obj = object(&id, &model, &prev, &text, usage(prompt, p), "completed");
            store.put(id.clone(), stored, obj.clone());
            obj
        };
        if !stream {
            let p = wait(&mut rx, |p| p.done).await?;
            return Ok(axum::Json(finish(&self.responses, &p)).into_response());
        }
        let (tx, body_rx) =
            tokio::sync::mpsc::unbounded_channel::<Result<Bytes, std::convert::Infallible>>();
        let opening = object(
            &accepted.meta.id.replacen("chatcmpl-", "resp_", 1),
            &accepted.meta.model,
            &Value::Null,
            "",
            Value::Null,
            "in_progress",
        );
        let item_id = opening["output"][0]["id"].clone();
        let mut opening = opening;
        opening["output"] = json!([]);
        let item = json!({"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []});
        let at = json!({"item_id": item["id"], "output_index": 0, "content_index": 0});
        let mut head = event("response.created", 0, json!({"response": opening}));
        head.push_str(&event(
            "response.in_progress",
            1,
            json!({"response": opening}),
        ));
        head.push_str(&event(
            "response.output_item.added",
            2,
            json!({"output_index": 0, "item": item}),
        ));
        let mut part = at.clone();
        part["part"] = json!({"type": "output_text", "text": "", "annotations": []});
        head.push_str(&event("response.content_part.added", 3, part));
        let _ = tx.send(Ok(head.into()));
        let store = std::sync::Arc::clone(&self.responses);
        tokio::spawn(async move {
            let delta = |text: String, seq: usize| {
                let mut d = at.clone();
                d["delta"] = json!(text);
                d["logprobs"] = json!([]);
                event("response.output_text.delta", seq, d)
            };
            let Ok(first) = wait(&mut rx, |p| p.generated > 0 || p.done).await else {
                return;
            };
            if tx
                .send(Ok(delta(output_text(first.generated), 4).into()))
                .is_err()
            {
                return; // client gone: dropping rx aborts the sequence
            }
            let Ok(p) = wait(&mut rx, |p| p.done).await else {
                return;
            };
            let full = output_text(p.generated);
            let sent = output_text(first.generated);
            let obj = finish(&store, &p);
            let mut tail = delta(full[sent.len()..].to_owned(), 5);
            let mut done = at.clone();
            done["text"] = json!(full);
            tail.push_str(&event("response.output_text.done", 6, done));
            tail.push_str(&event(
                "response.output_item.done",
                7,
                json!({"output_index": 0, "item": obj["output"][0]}),
            ));
            tail.push_str(&event("response.completed", 8, json!({"response": obj})));
            let _ = tx.send(Ok(tail.into()));
        });
        let body = Body::from_stream(tokio_stream_from(body_rx));
        Ok(([(header::CONTENT_TYPE, "text/event-stream")], body).into_response())
    }

    /// `GET /v1/responses/{id}`.
    pub(crate) fn retrieve(&self, id: &str) -> Result<Response, ApiError> {
        let (_, obj) = self.responses.get(id).ok_or_else(|| not_found(id))?;
        Ok(axum::Json(obj).into_response())
    }
}

async fn wait(
    rx: &mut watch::Receiver<Progress>,
    until: impl FnMut(&Progress) -> bool,
) -> Result<Progress, ApiError> {
    let p = *rx
        .wait_for(until)
        .await
        .map_err(|_| ApiError::unavailable("the engine stopped"))?;
    if p.rejected {
        return Err(ApiError::bad_request(
            "the request does not fit this instance",
            None,
        ));
    }
    Ok(p)
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// `POST /v1/embeddings`: a fixed 8-dimensional vector per input, usage at 4 bytes a token.
pub(crate) fn embeddings(body: &[u8]) -> Result<Response, ApiError> {
    let req: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))?;
    let inputs: Vec<String> = match req.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(Value::Array(a)) => vec![Value::Array(a.clone()).to_string()],
        _ => return Err(ApiError::bad_request("`input` is required", Some("input"))),
    };
    let tokens: usize = inputs.iter().map(|s| s.len().div_ceil(4).max(1)).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let h = s
                .bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
            let v: Vec<f64> = (0..8)
                .map(|k| f64::from((h >> k) & 0xff) / 255.0 - 0.5)
                .collect();
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    Ok(axum::Json(
        json!({"object": "list", "data": data, "model": req.get("model"),
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    )
    .into_response())
}
