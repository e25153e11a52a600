//! Anthropic's Messages API as vLLM 0.32 serves it (`vllm/entrypoints/anthropic/`):
//! `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A body is checked ([`validate`]) and converted to the chat body vLLM would
//! build from it ([`convert`]), then generated through the chat path, so the
//! prefix cache sees the same prompt as for the equivalent chat request and a
//! session's history is a cached prefix whichever API it speaks. The answer
//! is a `message` whose usage counts as vLLM's does: `input_tokens` = prompt −
//! cached, `cache_read_input_tokens` = cached. When the request has `tools`
//! and its last message is not a user turn carrying a `tool_result`, the
//! answer is one `tool_use` block calling the first tool with `{}` and
//! `stop_reason: "tool_use"` (so an SDK's tool-use loop can be driven);
//! otherwise text, `stop_reason: "max_tokens"` (generation always runs to
//! `max_tokens`, as chat's `finish_reason` is `length`). `stream: true` gets
//! Anthropic's SSE ([`sse`]). Errors are in Anthropic's shape.

mod convert;
mod pyjson;
mod sse;
mod validate;

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::engine::Progress;
use crate::error::{Anthropic, ApiError};
use crate::request::{Job, parse_chat};
use crate::server::SimServer;
use crate::text::output_text;

type Payload = Result<Bytes, BytesRejection>;

/// What every rendering of one answer repeats.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    /// `msg_{instance}-{serial}`.
    pub id: String,
    pub model: String,
    /// The `tool_use` block's id and tool, when the answer calls one.
    pub tool: Option<(String, String)>,
    pub prompt_tokens: usize,
}

impl Head {
    pub(crate) fn stop_reason(&self) -> &'static str {
        if self.tool.is_some() {
            "tool_use"
        } else {
            "max_tokens"
        }
    }

    /// `usage` after `p`: vLLM's `_build_anthropic_usage`.
    pub(crate) fn usage(&self, p: &Progress) -> Value {
        json!({
            "input_tokens": self.prompt_tokens.saturating_sub(p.cached_tokens),
            "output_tokens": p.generated,
            "cache_read_input_tokens": p.cached_tokens,
        })
    }

    /// The `tool_use` block as it stands before any input arrives.
    pub(crate) fn tool_block(&self) -> Option<Value> {
        self.tool
            .as_ref()
            .map(|(id, name)| json!({"type": "tool_use", "id": id, "name": name, "input": {}}))
    }

    /// The whole `message` once `p` is done.
    fn message(&self, p: &Progress) -> Value {
        let block = self
            .tool_block()
            .unwrap_or_else(|| json!({"type": "text", "text": output_text(p.generated)}));
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [block], "stop_reason": self.stop_reason(), "stop_sequence": null,
            "usage": self.usage(p),
        })
    }
}

/// `POST /v1/messages`.
pub(crate) async fn create(State(s): State<Arc<SimServer>>, body: Payload) -> Response {
    match try_create(&s, body).await {
        Ok(response) => response,
        Err(e) => Anthropic(e).into_response(),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, nothing generated.
pub(crate) async fn count(State(s): State<Arc<SimServer>>, body: Payload) -> Response {
    let counted = body
        .map_err(ApiError::from)
        .and_then(|b| job(&s, &b, false))
        .map(|(job, _)| {
            let n = job
                .token_ids
                .as_ref()
                .map_or_else(|| s.tokens.count(&job.prompt), Vec::len);
            json!({"input_tokens": n, "context_management": {"original_input_tokens": n}})
        });
    match counted {
        Ok(v) => Json(v).into_response(),
        Err(e) => Anthropic(e).into_response(),
    }
}

/// The chat job a Messages body becomes, and the tool its answer calls.
fn job(s: &SimServer, body: &[u8], generate: bool) -> Result<(Job, Option<String>), ApiError> {
    let tok = s.cfg.tokenizer.as_deref();
    let converted = convert::convert(body, generate, tok)?;
    let chat = serde_json::to_vec(&converted.chat)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))?;
    Ok((parse_chat(&chat, tok)?, converted.tool))
}

async fn try_create(s: &SimServer, body: Payload) -> Result<Response, ApiError> {
    let (job, tool) = job(s, &body?, true)?;
    let accepted = s.submit(&job)?;
    let name = accepted.meta.id.replacen("chatcmpl-", "", 1);
    let head = Head {
        id: format!("msg_{name}"),
        model: accepted.meta.model.clone(),
        tool: tool.map(|t| (format!("toolu_{name}"), t)),
        prompt_tokens: accepted.prompt_tokens,
    };
    if job.stream {
        return Ok(sse::response(head, accepted.rx));
    }
    // Dropping this future (client gone) drops `rx`, which aborts the sequence.
    let mut rx = accepted.rx;
    let p = *rx
        .wait_for(|p| p.done || p.rejected)
        .await
        .map_err(|_| ApiError::unavailable("the engine stopped"))?;
    if p.rejected {
        let msg = "the request does not fit this instance";
        return Err(ApiError::bad_request(msg, None));
    }
    Ok(Json(head.message(&p)).into_response())
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
