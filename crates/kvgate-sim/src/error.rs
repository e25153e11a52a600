//! The one error type of the HTTP API, rendered in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`, with vLLM's type names;
//! on the Messages routes in Anthropic's (`{"type": "error", "error": {"type",
//! "message"}}`, [`Anthropic`]).

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param,
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowedError",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
            s if s.is_client_error() => "BadRequestError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body, also used for an error event inside an SSE stream.
    pub(crate) fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }

    /// Anthropic's error type for this status.
    fn anthropic_kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if (400..500).contains(&s) => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The body in Anthropic's shape, also an SSE `error` event's data.
    pub(crate) fn anthropic_body(&self) -> serde_json::Value {
        json!({"type": "error", "error": {"type": self.anthropic_kind(), "message": self.message}})
    }
}

/// An [`ApiError`] answered in Anthropic's shape (the Messages routes).
#[derive(Debug)]
pub(crate) struct Anthropic(pub ApiError);

impl IntoResponse for Anthropic {
    fn into_response(self) -> Response {
        (self.0.status, Json(self.0.anthropic_body())).into_response()
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        Self::new(rejection.status(), rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
