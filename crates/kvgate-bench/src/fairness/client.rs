//! One tenant's request through the gateway, streamed: the time to its first
//! SSE `data:` chunk (from the moment it is sent, so a wait in the gateway's
//! queue counts), to its end, its `usage`, and its fate — served, refused
//! (429, or 503 when shed), cut off (no first token within the cap: the
//! client leaves, as a user would, and the gateway and engine see it go), or
//! failed.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::time::Instant;

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    Served,
    /// Refused by the gateway with this status (429 or 503).
    Refused(u16),
    /// No first token within the cap.
    CutOff,
    Failed(String),
}

/// What the client saw of one request; times are real, from its sending.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// To the response's headers: the gateway sends them once it has
    /// released the request and the engine has taken it.
    pub headers: Option<Duration>,
    pub ttft: Option<Duration>,
    pub total: Duration,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub fate: Fate,
}

/// POST `body` to `url` with `client` (which carries the tenant's key) and
/// read the stream to its end, or give up when no token came within `cap`.
pub async fn send(client: &reqwest::Client, url: &str, body: Bytes, cap: Duration) -> Outcome {
    let start = Instant::now();
    let deadline = start + cap;
    let mut out = Outcome {
        headers: None,
        ttft: None,
        total: Duration::ZERO,
        prompt_tokens: 0,
        completion_tokens: 0,
        fate: Fate::Served,
    };
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send();
    let resp = match tokio::time::timeout_at(deadline, sent).await {
        Err(_) => return out.ended(start, Fate::CutOff),
        Ok(Err(e)) => return out.ended(start, Fate::Failed(format!("send: {e}"))),
        Ok(Ok(r)) => r,
    };
    out.headers = Some(start.elapsed());
    let status = resp.status().as_u16();
    if status == 429 || status == 503 {
        return out.ended(start, Fate::Refused(status));
    }
    if !resp.status().is_success() {
        let text = resp.text().await.unwrap_or_default();
        let what = format!(
            "HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        );
        return out.ended(start, Fate::Failed(what));
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut done = false;
    loop {
        let next = if out.ttft.is_none() {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(n) => n,
                Err(_) => return out.ended(start, Fate::CutOff),
            }
        } else {
            stream.next().await
        };
        let Some(chunk) = next else { break };
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return out.ended(start, Fate::Failed(format!("body: {e}"))),
        };
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            for line in event.split(|&b| b == b'\n') {
                let Some(data) = line.strip_prefix(b"data:") else {
                    continue;
                };
                if out.ttft.is_none() {
                    out.ttft = Some(start.elapsed());
                }
                let data = data.trim_ascii();
                if data == b"[DONE]" {
                    done = true;
                } else {
                    out.read_usage(data);
                }
            }
        }
    }
    let fate = if done {
        Fate::Served
    } else {
        Fate::Failed("stream ended without [DONE]".to_owned())
    };
    out.ended(start, fate)
}

impl Outcome {
    fn ended(mut self, start: Instant, fate: Fate) -> Self {
        self.total = start.elapsed();
        self.fate = fate;
        self
    }

    /// The last chunk's `usage` (parsed only where the chunk has one).
    fn read_usage(&mut self, data: &[u8]) {
        if !data.windows(7).any(|w| w == b"\"usage\"") {
            return;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
            return;
        };
        let n = |k: &str| v.pointer(k).and_then(serde_json::Value::as_u64);
        if let (Some(p), Some(c)) = (n("/usage/prompt_tokens"), n("/usage/completion_tokens")) {
            (self.prompt_tokens, self.completion_tokens) = (p, c);
        }
    }
}

/// A client per tenant: its key on every request, connections enough for
/// an open loop.
pub fn for_tenant(key: &str) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))?,
    );
    Ok(reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .pool_max_idle_per_host(4096)
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_the_chunk_that_has_it() {
        let mut out = Outcome {
            headers: None,
            ttft: None,
            total: Duration::ZERO,
            prompt_tokens: 0,
            completion_tokens: 0,
            fate: Fate::Served,
        };
        out.read_usage(br#"{"choices":[{"delta":{"content":" the"}}]}"#);
        assert_eq!((out.prompt_tokens, out.completion_tokens), (0, 0));
        out.read_usage(br#"{"choices":[],"usage":{"prompt_tokens":1003,"completion_tokens":88}}"#);
        assert_eq!((out.prompt_tokens, out.completion_tokens), (1003, 88));
        assert!(for_tenant("k").is_ok());
    }
}
