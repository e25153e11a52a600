//! One request through the gateway, streamed (time to the first SSE chunk) or
//! not (time to the whole answer, which is then all the client can call its
//! TTFT): the answer's text (for multi-turn history) and its `usage`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;

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
    /// `None` when the request succeeded: an HTTP status ≥ 400, a transport error
    /// or a stream that ended without `[DONE]`.
    pub error: Option<String>,
}

/// POST `body` to `url` and read the answer (SSE when `stream`) to its end.
pub async fn send(
    client: &reqwest::Client,
    url: &str,
    body: Bytes,
    keep_text: bool,
    stream: bool,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
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
                } else {
                    read_chunk(data, keep_text, &mut out);
                }
            }
        }
    }
    out.total = start.elapsed();
    if out.error.is_none() && !done {
        out.error = Some("stream ended without [DONE]".to_owned());
    }
    out
}

/// End (exclusive, separator included) of the first complete SSE event in `buf`.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

/// Take the text and usage out of one chunk, or a whole answer. Parsing is
/// skipped for chunks that carry neither wanted text nor usage.
fn read_chunk(data: &[u8], keep_text: bool, out: &mut Outcome) {
    let has_usage = memfind(data, b"\"usage\"");
    if !keep_text && !has_usage {
        return;
    }
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let Some(id) = v
        .get("id")
        .and_then(Value::as_str)
        .filter(|_| out.id.is_empty())
    {
        id.clone_into(&mut out.id);
    }
    if let Some(choice) = v.pointer("/choices/0").filter(|_| keep_text) {
        let piece = choice
            .pointer("/delta/content")
            .or_else(|| choice.pointer("/message/content"))
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str);
        if let Some(piece) = piece {
            out.text.push_str(piece);
        }
    }
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
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
}
