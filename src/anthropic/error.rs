//! Anthropic's error wire: on `/v1/messages` and `/v1/messages/count_tokens`
//! every error — the gateway's own [`ApiError`], whatever layer raised it, and
//! an upstream's error answer — is rendered as
//! `{"type":"error","error":{"type":…,"message":…}}`, the shape the
//! `anthropic` SDKs map to their exception classes. Chosen here, in one place,
//! from the request path ([`is_anthropic_path`]), as `sagemaker::error` does.
//!
//! | kvgate error | status | `error.type` |
//! |---|---|---|
//! | bad JSON, bad body, bad header, slow body, wrong method | 400 / 405 / 408 / 415 / 431 | `invalid_request_error` |
//! | body over `max_body_bytes` | 413 | `request_too_large` |
//! | no or bad credential | 401 | `authentication_error` |
//! | model not allowed for the tenant | 403 | `permission_error` |
//! | unknown model or route | 404 | `not_found_error` |
//! | tenant quota | 429 | `rate_limit_error` |
//! | no instance can take it (all down, draining, shutting down) | 529 | `overloaded_error` |
//! | upstream too slow | 504 | `timeout_error` |
//! | upstream refused or broke, kvgate's own fault | 502 / 500 | `api_error` |
//! | an upstream's error answer | its status | by that status |

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use crate::error::{ApiError, ErrorKind, UpstreamFailure};

/// Anthropic's "the API is overloaded" status.
const OVERLOADED: u16 = 529;

/// Whether a request path speaks Anthropic's wire.
pub fn is_anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// `error.type` of an answer with this status.
fn type_of(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        OVERLOADED => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The status a gateway error has on this wire: its own, but 529 for "no
/// instance can take it" (the SDKs back off and retry an overload).
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Unavailable => StatusCode::from_u16(OVERLOADED).unwrap_or(kind.status()),
        _ => kind.status(),
    }
}

/// Re-render an error response in Anthropic's shape; others pass untouched.
pub fn reshape(resp: Response) -> Response {
    let (status, message) = if let Some(e) = resp.extensions().get::<ApiError>() {
        (status_of(e.kind), e.message.clone())
    } else if let Some(f) = resp.extensions().get::<UpstreamFailure>() {
        (f.status, f.message.clone())
    } else if resp.status().is_client_error() || resp.status().is_server_error() {
        // An error no part of kvgate described (a framework rejection).
        let reason = resp.status().canonical_reason().unwrap_or("request failed");
        (resp.status(), reason.to_owned())
    } else {
        return resp;
    };
    let body = json!({
        "type": "error",
        "error": {"type": type_of(status.as_u16()), "message": message},
    });
    crate::error::rebuild_json(resp, status, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;

    async fn shaped(resp: Response) -> (StatusCode, serde_json::Value) {
        let resp = reshape(resp);
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn gateway_errors_take_anthropics_types() {
        for (kind, status, ty) in [
            (ErrorKind::InvalidRequest, 400, "invalid_request_error"),
            (ErrorKind::InvalidJson, 400, "invalid_request_error"),
            (ErrorKind::PayloadTooLarge, 413, "request_too_large"),
            (ErrorKind::Unauthorized, 401, "authentication_error"),
            (ErrorKind::Forbidden, 403, "permission_error"),
            (ErrorKind::ModelNotFound, 404, "not_found_error"),
            (ErrorKind::RateLimited, 429, "rate_limit_error"),
            (ErrorKind::Unavailable, 529, "overloaded_error"),
            (ErrorKind::GatewayTimeout, 504, "timeout_error"),
            (ErrorKind::BadGateway, 502, "api_error"),
        ] {
            let (s, body) = shaped(ApiError::new(kind, "why").into_response()).await;
            assert_eq!(s.as_u16(), status, "{kind:?}");
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], ty, "{kind:?}");
            assert_eq!(body["error"]["message"], "why");
        }
    }

    #[tokio::test]
    async fn retry_hints_survive_and_successes_pass() {
        let r = reshape(ApiError::new(ErrorKind::Unavailable, "none").into_response());
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "1");
        let ok = reshape((StatusCode::OK, "fine").into_response());
        assert_eq!(ok.status(), StatusCode::OK);
        assert!(is_anthropic_path("/v1/messages/count_tokens"));
        assert!(!is_anthropic_path("/v1/messagesx"));
    }

    #[tokio::test]
    async fn an_upstream_answer_keeps_its_status() {
        let mut r = Response::new(axum::body::Body::from("{}"));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        r.extensions_mut().insert(UpstreamFailure {
            status: StatusCode::BAD_REQUEST,
            message: "prompt too long".into(),
        });
        let (s, body) = shaped(r).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["message"], "prompt too long");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
}
