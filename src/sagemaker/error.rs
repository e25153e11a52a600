//! SageMaker's error wire: on the SageMaker routes every error — the
//! gateway's own [`ApiError`], whatever layer raised it, and an upstream's
//! error answer — is rendered as `x-amzn-ErrorType: <code>` with a
//! `{"message": …}` body, the shape botocore maps to its modeled exceptions.
//! The shape is chosen here, in one place, from the request path
//! ([`is_sagemaker_path`]: `/endpoints/*`, and the container contract's
//! `/invocations` and `/ping`); elsewhere errors keep the OpenAI shape.
//!
//! | kvgate error | status | `x-amzn-ErrorType` |
//! |---|---|---|
//! | bad JSON, bad header, oversized or wrongly typed body, slow body, unknown endpoint | 400 | `ValidationError` |
//! | upstream error status, upstream timeout, upstream connection lost | 424 | `ModelError` (`OriginalStatusCode`, `OriginalMessage`) |
//! | tenant quota | 429 | `ThrottlingException` |
//! | fleet saturated past `queue.max_wait_ms`, or the queue full | 503 | `ThrottlingException` |
//! | no instance can take it | 503 | `ServiceUnavailable` |
//! | kvgate's own fault | 500 | `InternalFailure` |
//! | SigV4: bad signature, stale date, changed body / unknown key / none | 403 | `InvalidSignatureException` / `UnrecognizedClientException` / `MissingAuthenticationTokenException` |
//! | SigV4: unparsable `Authorization` | 400 | `IncompleteSignatureException` |
//! | bearer credential missing or invalid | 401 | `UnrecognizedClientException` |
//! | model not allowed for the tenant | 403 | `AccessDeniedException` |
//! | unknown route / method | 404 / 405 | `UnknownOperationException` |

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorKind, UpstreamFailure};

/// The header botocore reads the error code from.
pub const ERROR_TYPE: HeaderName = HeaderName::from_static("x-amzn-errortype");

/// Whether a request path speaks SageMaker's wire.
pub fn is_sagemaker_path(path: &str) -> bool {
    path.starts_with("/endpoints/") || path == "/invocations" || path == "/ping"
}

/// Status and `x-amzn-ErrorType` of a gateway error on the SageMaker wire.
fn shape(kind: ErrorKind) -> (StatusCode, &'static str) {
    use ErrorKind::*;
    match kind {
        InvalidJson | InvalidRequest | UnsupportedMediaType | PayloadTooLarge | RequestTimeout
        | ModelNotFound | EndpointNotFound | HeadersTooLarge | UriTooLong => {
            (StatusCode::BAD_REQUEST, "ValidationError")
        }
        RouteNotFound | ResponseNotFound => (StatusCode::NOT_FOUND, "UnknownOperationException"),
        MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "UnknownOperationException"),
        Unauthorized => (StatusCode::UNAUTHORIZED, "UnrecognizedClientException"),
        IncompleteSignature => (StatusCode::BAD_REQUEST, "IncompleteSignatureException"),
        MissingAuthenticationToken => {
            (StatusCode::FORBIDDEN, "MissingAuthenticationTokenException")
        }
        InvalidSignature => (StatusCode::FORBIDDEN, "InvalidSignatureException"),
        UnrecognizedClient => (StatusCode::FORBIDDEN, "UnrecognizedClientException"),
        Forbidden => (StatusCode::FORBIDDEN, "AccessDeniedException"),
        RateLimited => (StatusCode::TOO_MANY_REQUESTS, "ThrottlingException"),
        QueueTimeout => (StatusCode::SERVICE_UNAVAILABLE, "ThrottlingException"),
        BadGateway | GatewayTimeout => (StatusCode::FAILED_DEPENDENCY, "ModelError"),
        Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        Internal => (StatusCode::INTERNAL_SERVER_ERROR, "InternalFailure"),
    }
}

/// Re-render an error response in SageMaker's shape; others pass untouched.
pub fn reshape(resp: Response) -> Response {
    if resp.headers().contains_key(ERROR_TYPE) {
        return resp;
    }
    if let Some(e) = resp.extensions().get::<ApiError>().cloned() {
        let (status, code) = shape(e.kind);
        let mut body = json!({ "message": e.message });
        if code == "ModelError" {
            body["OriginalStatusCode"] = json!(e.kind.status().as_u16());
            body["OriginalMessage"] = json!(e.message);
        }
        return rebuild(resp, status, code, &body);
    }
    if let Some(f) = resp.extensions().get::<UpstreamFailure>().cloned() {
        return rebuild(
            resp,
            StatusCode::FAILED_DEPENDENCY,
            "ModelError",
            &model_error(&f),
        );
    }
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    // An error no part of kvgate described (a framework rejection): its
    // status says enough to pick the code.
    let kind = if status.is_client_error() {
        ErrorKind::InvalidRequest
    } else {
        ErrorKind::Internal
    };
    let (new_status, code) = shape(kind);
    let message = status
        .canonical_reason()
        .unwrap_or("request failed")
        .to_owned();
    rebuild(resp, new_status, code, &json!({ "message": message }))
}

/// SageMaker's `ModelError` for an upstream's error answer.
fn model_error(f: &UpstreamFailure) -> Value {
    let side = if f.status.is_client_error() {
        "client"
    } else {
        "server"
    };
    json!({
        "message": format!(
            "Received {side} error ({}) from the model with message \"{}\"",
            f.status.as_u16(),
            f.message
        ),
        "OriginalStatusCode": f.status.as_u16(),
        "OriginalMessage": f.message,
    })
}

fn rebuild(resp: Response, status: StatusCode, code: &'static str, body: &Value) -> Response {
    let mut resp = crate::error::rebuild_json(resp, status, body);
    resp.headers_mut()
        .insert(ERROR_TYPE, HeaderValue::from_static(code));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    #[test]
    fn every_gateway_error_has_a_sagemaker_code() {
        let r = reshape(ApiError::new(ErrorKind::EndpointNotFound, "no such").into_response());
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers()[ERROR_TYPE], "ValidationError");
        let r = reshape(ApiError::new(ErrorKind::Unavailable, "none").into_response());
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "1");
        let ok = Response::new(axum::body::Body::empty());
        assert!(!reshape(ok).headers().contains_key(ERROR_TYPE));
    }

    #[test]
    fn sagemaker_paths() {
        assert!(is_sagemaker_path("/endpoints/x/invocations"));
        assert!(is_sagemaker_path("/endpoints/%ff/invocations"));
        assert!(!is_sagemaker_path("/v1/chat/completions"));
        assert!(!is_sagemaker_path("/endpointsx"));
    }
}
