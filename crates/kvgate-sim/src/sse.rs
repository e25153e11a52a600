//! Streaming responses: OpenAI server-sent events rendered straight from the
//! request's progress. Chat streams open with a role delta, every output token is
//! its own `data:` chunk, then a chunk carrying `finish_reason`, a usage chunk when
//! `stream_options.include_usage` is set, and `data: [DONE]`. Nothing is sent
//! before the first token, so time to first chunk is the simulated TTFT. Chunks
//! that are due together (a slow reader) go out in one write.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;
use tokio::sync::watch;

use crate::engine::Progress;
use crate::error::ApiError;
use crate::request::Api;
use crate::response::{Meta, Usage};
use crate::text::output_token;

/// Pre-rendered pieces of this request's chunks.
struct Frames {
    api: Api,
    /// `data: {"id":…,"object":…,"created":…,"model":…,"choices":[`
    head: String,
}

impl Frames {
    fn new(meta: &Meta) -> Self {
        let object = match meta.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        };
        // Only `id` and `model` can need escaping; serde_json does it.
        let head = format!(
            r#"data: {{"id":{},"object":"{object}","created":{},"model":{},"choices":["#,
            serde_json::Value::from(meta.id.as_str()),
            meta.created,
            serde_json::Value::from(meta.model.as_str()),
        );
        Self {
            api: meta.api,
            head,
        }
    }

    fn choice(&self, out: &mut Vec<u8>, body: &str) {
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice(body.as_bytes());
        out.extend_from_slice(b"}\n\n");
    }

    fn role(&self, out: &mut Vec<u8>) {
        if self.api == Api::Chat {
            let body = r#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#;
            self.choice(out, body);
        }
    }

    fn token(&self, out: &mut Vec<u8>, i: usize) {
        let (open, close) = match self.api {
            Api::Chat => (
                r#"{"index":0,"delta":{"content":""#,
                r#""},"logprobs":null,"finish_reason":null}]"#,
            ),
            Api::Completion => (
                r#"{"index":0,"text":""#,
                r#"","logprobs":null,"finish_reason":null}]"#,
            ),
        };
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice(open.as_bytes());
        out.extend_from_slice(output_token(i).as_bytes()); // plain words: no escaping
        out.extend_from_slice(close.as_bytes());
        out.extend_from_slice(b"}\n\n");
    }

    fn finish(&self, out: &mut Vec<u8>) {
        let body = match self.api {
            Api::Chat => r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]"#,
            Api::Completion => r#"{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]"#,
        };
        self.choice(out, body);
    }

    fn usage(&self, out: &mut Vec<u8>, usage: Usage) {
        self.choice(out, &format!(r#"],"usage":{}"#, usage.json()));
    }
}

struct StreamState {
    rx: watch::Receiver<Progress>,
    frames: Frames,
    prompt_tokens: usize,
    include_usage: bool,
    emitted: usize,
    finished: bool,
}

impl StreamState {
    /// Render what `p` adds to what was sent; `None` when it adds nothing.
    fn render(&mut self, p: Progress) -> Option<Bytes> {
        if p.rejected {
            self.finished = true;
            let err = ApiError::bad_request("the request does not fit this instance", None);
            return Some(Bytes::from(format!(
                "data: {}\n\ndata: [DONE]\n\n",
                err.body()
            )));
        }
        if p.generated <= self.emitted && !p.done {
            return None;
        }
        let mut out = Vec::with_capacity(
            (p.generated.saturating_sub(self.emitted) + 3) * (self.frames.head.len() + 80),
        );
        if self.emitted == 0 && p.generated > 0 {
            self.frames.role(&mut out);
        }
        (self.emitted..p.generated).for_each(|i| self.frames.token(&mut out, i));
        self.emitted = p.generated;
        if p.done {
            self.finished = true;
            self.frames.finish(&mut out);
            if self.include_usage {
                let usage = Usage {
                    prompt_tokens: self.prompt_tokens,
                    completion_tokens: p.generated,
                    cached_tokens: p.cached_tokens,
                };
                self.frames.usage(&mut out, usage);
            }
            out.extend_from_slice(b"data: [DONE]\n\n");
        }
        Some(Bytes::from(out))
    }
}

/// A `text/event-stream` response that follows `rx` until the request is done.
/// Dropping it (the client went away) drops `rx`, which aborts the sequence.
pub(crate) fn response(
    meta: &Meta,
    rx: watch::Receiver<Progress>,
    prompt_tokens: usize,
    include_usage: bool,
) -> Response {
    let state = StreamState {
        rx,
        frames: Frames::new(meta),
        prompt_tokens,
        include_usage,
        emitted: 0,
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
                let err = ApiError::unavailable("the engine stopped");
                let bytes = Bytes::from(format!("data: {}\n\n", err.body()));
                return Some((Ok(bytes), st));
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
