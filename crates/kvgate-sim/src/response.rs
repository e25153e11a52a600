//! Non-streaming response bodies and the `usage` object, in OpenAI's format.

use serde_json::{Value, json};

use crate::request::Api;
use crate::text::output_text;

/// What every response (and every stream chunk) of one request repeats.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub api: Api,
    pub id: String,
    /// The number at the end of `id`.
    pub serial: u64,
    pub created: u64,
    pub model: String,
}

/// Token counts of a finished (or finishing) request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Usage {
    pub(crate) fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// The whole response of a non-streaming request. Generation always runs to
/// `max_tokens`, so `finish_reason` is `length`, as vLLM reports it.
pub(crate) fn complete(meta: &Meta, usage: Usage) -> Value {
    let text = output_text(usage.completion_tokens);
    let (object, choice) = match meta.api {
        Api::Chat => (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": "length"}),
        ),
        Api::Completion => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}),
        ),
    };
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage.json(),
    })
}
