//! The one error type: every rejection and upstream failure becomes an
//! [`ApiError`], mapped to a status in one exhaustive `match` and rendered in
//! OpenAI's shape `{"error":{"message","type","param","code"}}`. On the
//! SageMaker routes the same error is re-rendered in SageMaker's shape by
//! [`crate::sagemaker::error`], from the [`ApiError`] kept in the response.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// What went wrong, from the client's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The body is not valid JSON (syntax, encoding, duplicate keys, depth).
    InvalidJson,
    /// Valid JSON of the wrong shape, or a bad header value.
    InvalidRequest,
    UnsupportedMediaType,
    PayloadTooLarge,
    /// The request head is over the gateway's size or header-count limit.
    HeadersTooLarge,
    /// The request target is over the gateway's length limit.
    UriTooLong,
    /// The request body did not arrive within `server.timeouts.body_read_ms`.
    RequestTimeout,
    ModelNotFound,
    /// A response id this tenant was not issued, or whose instance is gone.
    ResponseNotFound,
    EndpointNotFound,
    RouteNotFound,
    MethodNotAllowed,
    Unauthorized,
    /// A SigV4 `Authorization` header that cannot be parsed.
    IncompleteSignature,
    /// No credential where only SigV4 is accepted.
    MissingAuthenticationToken,
    /// A SigV4 signature that does not verify: wrong secret, stale date,
    /// a header or the body changed after signing.
    InvalidSignature,
    /// A SigV4 access key id kvgate does not know.
    UnrecognizedClient,
    Forbidden,
    RateLimited,
    /// The fleet stayed saturated past `queue.max_wait_ms`, or the queue is full.
    QueueTimeout,
    /// Upstream refused, reset or answered garbage.
    BadGateway,
    /// No instance could take the request.
    Unavailable,
    /// Upstream too slow to connect, answer or continue.
    GatewayTimeout,
    Internal,
}

impl ErrorKind {
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidJson | Self::InvalidRequest => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UriTooLong => StatusCode::URI_TOO_LONG,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::ModelNotFound
            | Self::ResponseNotFound
            | Self::EndpointNotFound
            | Self::RouteNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::IncompleteSignature => StatusCode::BAD_REQUEST,
            Self::MissingAuthenticationToken
            | Self::InvalidSignature
            | Self::UnrecognizedClient
            | Self::Forbidden => StatusCode::FORBIDDEN,
            Self::RateLimited | Self::QueueTimeout => StatusCode::TOO_MANY_REQUESTS,
            Self::BadGateway => StatusCode::BAD_GATEWAY,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    fn error_type(self) -> &'static str {
        match self {
            Self::InvalidJson
            | Self::InvalidRequest
            | Self::UnsupportedMediaType
            | Self::PayloadTooLarge
            | Self::HeadersTooLarge
            | Self::UriTooLong
            | Self::RequestTimeout
            | Self::ModelNotFound
            | Self::ResponseNotFound
            | Self::EndpointNotFound
            | Self::RouteNotFound
            | Self::MethodNotAllowed => "invalid_request_error",
            Self::Unauthorized
            | Self::IncompleteSignature
            | Self::MissingAuthenticationToken
            | Self::InvalidSignature
            | Self::UnrecognizedClient => "authentication_error",
            Self::Forbidden => "permission_error",
            Self::RateLimited | Self::QueueTimeout => "rate_limit_error",
            Self::BadGateway | Self::Unavailable | Self::GatewayTimeout | Self::Internal => {
                "server_error"
            }
        }
    }

    /// OpenAI's `error.code`, also the `reason` label of the rejection metric.
    pub fn code(self) -> &'static str {
        match self {
            Self::InvalidJson => "invalid_json",
            Self::InvalidRequest => "invalid_request",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::PayloadTooLarge => "payload_too_large",
            Self::HeadersTooLarge => "request_header_fields_too_large",
            Self::UriTooLong => "uri_too_long",
            Self::RequestTimeout => "request_timeout",
            Self::ModelNotFound => "model_not_found",
            Self::ResponseNotFound => "response_not_found",
            Self::EndpointNotFound => "endpoint_not_found",
            Self::RouteNotFound => "route_not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::Unauthorized => "invalid_api_key",
            Self::IncompleteSignature => "incomplete_signature",
            Self::MissingAuthenticationToken => "missing_authentication_token",
            Self::InvalidSignature => "invalid_signature",
            Self::UnrecognizedClient => "unrecognized_client",
            Self::Forbidden => "forbidden",
            Self::RateLimited => "rate_limit_exceeded",
            Self::QueueTimeout => "queue_timeout",
            Self::BadGateway => "upstream_error",
            Self::Unavailable => "no_upstream_available",
            Self::GatewayTimeout => "upstream_timeout",
            Self::Internal => "internal_error",
        }
    }
}

/// An error with its message and the offending parameter, if one.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub param: Option<String>,
    /// Extra response headers (`retry-after`, `www-authenticate`, …).
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            param: None,
            headers: Vec::new(),
        }
    }

    /// A 400 about one field of the request.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message).with_param(param)
    }

    /// A 404 for a model no endpoint serves, in OpenAI's words.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            ErrorKind::ModelNotFound,
            format!("The model `{model}` does not exist or you do not have access to it."),
        )
        .with_param("model")
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.code())
    }
}

impl std::error::Error for ApiError {}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: &'static str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        crate::telemetry::rejection(self.kind.code());
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind.error_type(),
                param: self.param.as_deref(),
                code: self.kind.code(),
            },
        };
        // Serialising this struct cannot fail; fall back to a fixed body anyway.
        let json = serde_json::to_vec(&body).unwrap_or_else(|_| {
            br#"{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal_error"}}"#.to_vec()
        });
        let mut resp = (self.kind.status(), json).into_response();
        // Kept beside the rendered body so that the wire layer of a route
        // (`crate::sagemaker::error`) can render the same error in its own shape.
        resp.extensions_mut().insert(self.clone());
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.kind == ErrorKind::GatewayTimeout {
            // The upstream may still be generating: a client retry would run
            // the same generation twice (the OpenAI SDK and botocore retry 504s).
            h.insert("x-should-retry", HeaderValue::from_static("false"));
        }
        if self.kind == ErrorKind::Unavailable {
            // No instance can take it now (all ejected or cooling down, or the
            // gateway is shutting down): worth retrying, after a pause.
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        for (k, v) in self.headers {
            h.insert(k, v);
        }
        resp
    }
}

/// `resp` with `status` and `body` as its JSON, its headers kept but those
/// that described the old body: how a route's wire re-renders an error in
/// its own shape (`sagemaker::error`, `anthropic::error`).
pub fn rebuild_json(resp: Response, status: StatusCode, body: &serde_json::Value) -> Response {
    let (mut parts, _) = resp.into_parts();
    parts.status = status;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Serialising a Value cannot fail; a fixed body keeps this total anyway.
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| br#"{"message":"error"}"#.to_vec());
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// An upstream's error answer (status and message), put into the relayed
/// response's extensions so that a route's wire can show it in its shape.
#[derive(Debug, Clone)]
pub struct UpstreamFailure {
    pub status: StatusCode,
    pub message: String,
}

/// A configuration error: which field, and why. Lives here, beside the API's
/// error, so that every module that validates its own config section
/// (`config`, `tenancy::settings`) can name it without importing the other.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod retry_hints {
    use super::*;

    #[test]
    fn a_503_says_when_to_retry_and_a_504_not_to() {
        let r = ApiError::new(ErrorKind::Unavailable, "none").into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::new(ErrorKind::GatewayTimeout, "slow").into_response();
        assert_eq!(r.headers()["x-should-retry"], "false");
        assert!(!r.headers().contains_key(header::RETRY_AFTER));
    }
}
