//! One request through the gateway, streamed (time to the first SSE chunk) or
//! not (time to the whole answer, which is then all the client can call its
//! TTFT): the answer's text (for multi-turn history) and its `usage`, read
//! from OpenAI's shapes or Anthropic's (a `message`; `message_start`,
//! `content_block_delta`, `message_delta`, `message_stop` events, with
//! prompt tokens = `input_tokens` + `cache_read_input_tokens` +
//! `cache_creation_input_tokens`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;

use crate::conversation::MESSAGES_HEADERS;
use crate::regime::Api;

/// What the client saw of one request.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Real time from sending to the first `data:` chunk; not streamed, to
    /// the whole answer.
    pub ttft: Option<Duration>,
    /// Real time from sending to the end of the body.
    pub total: Duration,
    /// Concatenated `delta.content` / `text` of the chunks (only when asked for).
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    /// The response's `id` (the instance's name and its serial there).
    pub id: String,
    /// `None` when the request succeeded: an HTTP status ≥ 400, a transport error,
    /// an Anthropic `error` event or a stream that ended without `[DONE]` /
    /// `message_stop`.
    pub error: Option<String>,
}

/// POST `body` to `url` as a client of `api` and read the answer (SSE when
/// `stream`) to its end.
pub async fn send(
    client: &reqwest::Client,
    url: &str,
    body: Bytes,
    keep_text: bool,
    stream: bool,
    api: Api,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    let mut req = client.post(url).header("content-type", "application/json");
    if api == Api::Messages {
        for (name, value) in MESSAGES_HEADERS {
            req = req.header(name, value);
        }
    }
    let resp = req.body(body).send().await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("send: {e}"));
            out.total = start.elapsed();
            return out;
        }
    };
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        out.error = Some(format!(
            "HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
        out.total = start.elapsed();
        return out;
    }
    if !stream {
        match resp.bytes().await {
            Ok(body) => read_chunk(&body, keep_text, &mut out),
            Err(e) => out.error = Some(format!("body: {e}")),
        }
        out.total = start.elapsed();
        out.ttft = out.error.is_none().then_some(out.total);
        return out;
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                out.error = Some(format!("body: {e}"));
                break;
            }
        };
        buf.extend_from_slice(&chunk);
        while let Some(end) = find_event_end(&buf) {
            let event: Vec<u8> = buf.drain(..end).collect();
            for line in event.split(|&b| b == b'\n') {
                let Some(data) = line.strip_prefix(b"data:") else {
                    continue; // comments (keep-alives), blank lines, other fields
                };
                if out.ttft.is_none() {
                    out.ttft = Some(start.elapsed());
                }
                let data = data.trim_ascii();
                if data == b"[DONE]" {
                    done = true;
                } else if memfind(data, b"\"message_stop\"") {
                    done = true; // Anthropic's last event
                } else {
                    read_chunk(data, keep_text, &mut out);
                }
            }
        }
    }
    out.total = start.elapsed();
    if out.error.is_none() && !done {
        out.error = Some("stream ended without [DONE] or message_stop".to_owned());
    }
    out
}

/// End (exclusive, separator included) of the first complete SSE event in `buf`.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

/// Take the text and usage out of one chunk, or a whole answer. Parsing is
/// skipped for chunks that carry neither wanted text, usage nor an error.
fn read_chunk(data: &[u8], keep_text: bool, out: &mut Outcome) {
    let has_usage = memfind(data, b"\"usage\"");
    let has_error = memfind(data, b"\"error\"");
    if !keep_text && !has_usage && !has_error {
        return;
    }
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // Anthropic: `message_start` carries the message (id, usage) inside.
    let message = v.get("message").filter(|m| m.is_object()).unwrap_or(&v);
    if let Some(id) = message
        .get("id")
        .and_then(Value::as_str)
        .filter(|_| out.id.is_empty())
    {
        id.clone_into(&mut out.id);
    }
    if v["type"] == "error" {
        let what = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("?");
        out.error
            .get_or_insert_with(|| format!("error event: {what}"));
    }
    if keep_text {
        read_text(&v, out);
    }
    if let Some(usage) = message.get("usage").filter(|u| u.is_object()) {
        if usage.get("input_tokens").is_some() || usage.get("output_tokens").is_some() {
            read_anthropic_usage(usage, out);
            return;
        }
        out.prompt_tokens = usage
            .get("prompt_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        out.completion_tokens = usage
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        out.cached_tokens = usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
    }
}

/// The answer's text in `v`: a chunk's or a whole answer's, OpenAI's or
/// Anthropic's (a `text_delta`, or a message's text blocks).
fn read_text(v: &Value, out: &mut Outcome) {
    if let Some(choice) = v.pointer("/choices/0") {
        let piece = choice
            .pointer("/delta/content")
            .or_else(|| choice.pointer("/message/content"))
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str);
        if let Some(piece) = piece {
            out.text.push_str(piece);
        }
    } else if let Some(piece) = v.pointer("/delta/text").and_then(Value::as_str) {
        out.text.push_str(piece);
    } else if let Some(blocks) = v.get("content").and_then(Value::as_array) {
        for t in blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
        {
            out.text.push_str(t);
        }
    }
}

/// Anthropic's usage: `output_tokens`, and when `input_tokens` is given the
/// prompt (input + cache reads + cache writes) and its cached part. A
/// `message_delta` without `input_tokens` keeps what `message_start` said.
fn read_anthropic_usage(usage: &Value, out: &mut Outcome) {
    let n = |k: &str| usage.get(k).and_then(Value::as_u64);
    if let Some(output) = n("output_tokens") {
        out.completion_tokens = output;
    }
    if let Some(input) = n("input_tokens") {
        let read = n("cache_read_input_tokens").unwrap_or(0);
        out.cached_tokens = read;
        out.prompt_tokens = input + read + n("cache_creation_input_tokens").unwrap_or(0);
    }
}

fn memfind(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_give_text_and_usage() {
        let mut out = Outcome::default();
        read_chunk(
            br#"{"choices":[{"delta":{"content":" the"}}]}"#,
            true,
            &mut out,
        );
        read_chunk(br#"{"choices":[{"text":" kv"}]}"#, true, &mut out);
        read_chunk(
            br#"{"choices":[],"usage":{"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}"#,
            false,
            &mut out,
        );
        assert_eq!(out.text, " the kv");
        let mut whole = Outcome::default();
        read_chunk(
            br#"{"choices":[{"message":{"content":"all"}}],"usage":{"prompt_tokens":9}}"#,
            true,
            &mut whole,
        );
        assert_eq!((whole.text.as_str(), whole.prompt_tokens), ("all", 9));
        read_chunk(br#"{"id":"cmpl-sim-1-7","usage":{}}"#, false, &mut whole);
        assert_eq!(whole.id, "cmpl-sim-1-7");
        assert_eq!((out.completion_tokens, out.cached_tokens), (2, 32));
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }

    #[test]
    fn anthropic_messages_and_events_give_text_usage_and_id() {
        let mut whole = Outcome::default();
        read_chunk(
            br#"{"id":"msg_sim-0-4","type":"message","content":[{"type":"text","text":"hi"}],
                 "usage":{"input_tokens":10,"output_tokens":3,"cache_read_input_tokens":90}}"#,
            true,
            &mut whole,
        );
        assert_eq!(
            (whole.id.as_str(), whole.text.as_str()),
            ("msg_sim-0-4", "hi")
        );
        assert_eq!(
            (
                whole.prompt_tokens,
                whole.completion_tokens,
                whole.cached_tokens
            ),
            (100, 3, 90)
        );

        let mut out = Outcome::default();
        read_chunk(
            br#"{"type":"message_start","message":{"id":"msg_sim-1-9","usage":
                 {"input_tokens":4,"output_tokens":0,"cache_read_input_tokens":16,
                  "cache_creation_input_tokens":2}}}"#,
            false,
            &mut out,
        );
        assert_eq!(
            (out.id.as_str(), out.prompt_tokens, out.cached_tokens),
            ("msg_sim-1-9", 22, 16)
        );
        read_chunk(
            br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" the"}}"#,
            true,
            &mut out,
        );
        // Anthropic's own message_delta has output_tokens only: the prompt stays.
        read_chunk(
            br#"{"type":"message_delta","usage":{"output_tokens":5}}"#,
            false,
            &mut out,
        );
        assert_eq!(out.text, " the");
        assert_eq!(
            (out.prompt_tokens, out.completion_tokens, out.cached_tokens),
            (22, 5, 16)
        );
        assert!(out.error.is_none());
        read_chunk(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
            false,
            &mut out,
        );
        assert_eq!(out.error.as_deref(), Some("error event: busy"));
    }
}
