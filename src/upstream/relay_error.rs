//! An upstream's error answer, relayed in OpenAI's error shape: the status
//! and message are the upstream's, the shape the one clients parse. A body
//! already in that shape (`{"error": {"message": …}}`) passes through byte
//! for byte; vLLM's older top-level form (`{"object": "error", "message": …}`),
//! a bare `{"error": "boom"}`, or an HTML or text page is rewrapped. Error
//! bodies are small; at most [`MAX_ERROR_BODY`] bytes are read (the rest of
//! the message is cut), under the idle timeout.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::headers;

pub const MAX_ERROR_BODY: usize = 64 * 1024;
/// Characters of a non-JSON error page kept as the message.
const MAX_MESSAGE_CHARS: usize = 512;

async fn read_bounded(upstream: Response<Incoming>, idle: Duration) -> Bytes {
    let mut out = BytesMut::new();
    let mut stream = http_body_util::BodyExt::into_data_stream(upstream.into_body());
    while out.len() < MAX_ERROR_BODY {
        match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(Ok(chunk))) => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out.truncate(MAX_ERROR_BODY);
    out.freeze()
}

fn is_openai_shaped(v: &Value) -> bool {
    v.get("error")
        .and_then(|e| e.get("message"))
        .is_some_and(Value::is_string)
}

fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// The message of an error body in whatever shape it came.
fn message_of(body: &[u8], status: StatusCode) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        for m in [v.get("message"), v.get("error"), v.get("detail")] {
            match m {
                Some(Value::String(s)) => return s.clone(),
                Some(other @ (Value::Object(_) | Value::Array(_))) => return other.to_string(),
                _ => {}
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return format!(
            "the upstream answered {status} with no message{}",
            status
                .canonical_reason()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
    }
    text.chars().take(MAX_MESSAGE_CHARS).collect()
}

/// The client's response for an upstream error answer.
pub async fn relay(upstream: Response<Incoming>, idle: Duration) -> Response {
    let status = upstream.status();
    let mut hdrs = headers::client_response(upstream.headers());
    let body = read_bounded(upstream, idle).await;
    let parsed = serde_json::from_slice::<Value>(&body).ok();
    let failure = crate::error::UpstreamFailure {
        status,
        message: parsed
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .map_or_else(|| message_of(&body, status), str::to_owned),
    };
    let out = if parsed.as_ref().is_some_and(is_openai_shaped) {
        body
    } else {
        let param = parsed
            .as_ref()
            .and_then(|v| v.get("param"))
            .cloned()
            .unwrap_or(Value::Null);
        let wrapped = json!({"error": {
            "message": message_of(&body, status),
            "type": error_type(status),
            "param": param,
            "code": "upstream_error",
        }});
        Bytes::from(serde_json::to_vec(&wrapped).unwrap_or_default())
    };
    hdrs.remove(header::CONTENT_LENGTH);
    hdrs.remove(header::CONTENT_ENCODING);
    hdrs.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let mut resp = Response::new(Body::from(out));
    resp.extensions_mut().insert(failure);
    *resp.status_mut() = status;
    *resp.headers_mut() = hdrs;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_found_in_every_shape_vllm_and_proxies_send() {
        let s = StatusCode::BAD_REQUEST;
        assert_eq!(
            message_of(
                br#"{"object":"error","message":"too long","type":"BadRequestError","code":400}"#,
                s
            ),
            "too long"
        );
        assert_eq!(message_of(br#"{"error":"boom"}"#, s), "boom");
        assert_eq!(message_of(br#"{"detail":"Not Found"}"#, s), "Not Found");
        assert_eq!(
            message_of(b"<html>431 Request Header Fields Too Large</html>", s),
            "<html>431 Request Header Fields Too Large</html>"
        );
        assert!(message_of(b"", StatusCode::INTERNAL_SERVER_ERROR).contains("500"));
        assert_eq!(
            message_of("é".repeat(2000).as_bytes(), s).chars().count(),
            MAX_MESSAGE_CHARS
        );
        assert!(is_openai_shaped(
            &json!({"error": {"message": "x", "type": "y"}})
        ));
        assert!(!is_openai_shaped(&json!({"error": "x"})));
    }
}
