//! A streamed Messages answer: Anthropic's server-sent events, `event: <type>`
//! then `data: <json>`, in the order vLLM's `message_stream_converter` sends
//! them. Nothing is sent before the first token, so time to the first event is
//! the simulated TTFT; then `message_start` (usage so far: `input_tokens`,
//! `output_tokens` 0, `cache_read_input_tokens`) and `content_block_start`,
//! one `text_delta` a token (a `tool_use` answer: its `input_json_delta` at
//! the end), `content_block_stop`, `message_delta` (stop reason, final
//! usage) and `message_stop`. No `ping` (vLLM sends none). Dropping the body
//! (the client left) drops the receiver, which aborts the sequence.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::Head;
use crate::engine::Progress;
use crate::error::ApiError;
use crate::text::output_token;

fn event(out: &mut Vec<u8>, kind: &str, data: &Value) {
    out.extend_from_slice(format!("event: {kind}\ndata: {data}\n\n").as_bytes());
}

struct StreamState {
    rx: watch::Receiver<Progress>,
    head: Head,
    emitted: usize,
    started: bool,
    finished: bool,
}

impl StreamState {
    /// Render what `p` adds to what was sent; `None` when it adds nothing.
    fn render(&mut self, p: Progress) -> Option<Bytes> {
        let mut out = Vec::new();
        if p.rejected {
            self.finished = true;
            let err = ApiError::bad_request("the request does not fit this instance", None);
            event(&mut out, "error", &err.anthropic_body());
            return Some(out.into());
        }
        if p.generated <= self.emitted && !p.done {
            return None;
        }
        if !self.started {
            self.started = true;
            self.start(&mut out, &p);
        }
        if self.head.tool.is_none() {
            for i in self.emitted..p.generated {
                // Plain words: no escaping needed.
                let delta = format!(
                    r#"event: content_block_delta
data: {{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{}"}}}}

"#,
                    output_token(i)
                );
                out.extend_from_slice(delta.as_bytes());
            }
        }
        self.emitted = p.generated;
        if p.done {
            self.finished = true;
            self.finish(&mut out, &p);
        }
        Some(out.into())
    }

    fn start(&self, out: &mut Vec<u8>, p: &Progress) {
        let opening = Progress { generated: 0, ..*p };
        let message = json!({
            "id": self.head.id, "type": "message", "role": "assistant", "model": self.head.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": self.head.usage(&opening),
        });
        event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        let block = self
            .head
            .tool_block()
            .unwrap_or_else(|| json!({"type": "text", "text": ""}));
        let start = json!({"type": "content_block_start", "index": 0, "content_block": block});
        event(out, "content_block_start", &start);
    }

    fn finish(&self, out: &mut Vec<u8>, p: &Progress) {
        if self.head.tool.is_some() {
            let delta = json!({"type": "input_json_delta", "partial_json": "{}"});
            let d = json!({"type": "content_block_delta", "index": 0, "delta": delta});
            event(out, "content_block_delta", &d);
        }
        event(
            out,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        );
        let delta = json!({"stop_reason": self.head.stop_reason(), "stop_sequence": null});
        let usage = self.head.usage(p);
        let d = json!({"type": "message_delta", "delta": delta, "usage": usage});
        event(out, "message_delta", &d);
        event(out, "message_stop", &json!({"type": "message_stop"}));
    }
}

/// A `text/event-stream` response that follows `rx` until the answer is done.
pub(crate) fn response(head: Head, rx: watch::Receiver<Progress>) -> Response {
    let state = StreamState {
        rx,
        head,
        emitted: 0,
        started: false,
        finished: false,
    };
    let body = stream::unfold(state, |mut st| async move {
        while !st.finished {
            let p = *st.rx.borrow_and_update();
            if let Some(bytes) = st.render(p) {
                return Some((Ok::<_, Infallible>(bytes), st));
            }
            if st.rx.changed().await.is_err() {
                st.finished = true;
                let mut out = Vec::new();
                let err = ApiError::unavailable("the engine stopped");
                event(&mut out, "error", &err.anthropic_body());
                return Some((Ok(Bytes::from(out)), st));
            }
        }
        None
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
