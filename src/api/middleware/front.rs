//! The router's outermost layer, after the request id and the trace span:
//! the checks every request gets before routing, in one pass rather than a
//! layer each (each `from_fn` layer boxes the rest of the stack per request).
//!
//! In order: what the connection guard refused before hyper saw it
//! (`server::conn::render`), framing that could smuggle a request
//! ([`super::framing`]), a path the route extractors cannot decode
//! ([`super::path`]); then the request goes on. On SageMaker's routes every
//! error, whichever of these or of the layers below raised it, is re-rendered
//! in SageMaker's shape (`sagemaker::error`), and on Anthropic's in its shape
//! (`anthropic::error`).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::anthropic::error::is_anthropic_path;
use crate::sagemaker::error::is_sagemaker_path;

/// The error wire of a route, from its path.
#[derive(Clone, Copy)]
enum Wire {
    OpenAi,
    SageMaker,
    Anthropic,
}

pub async fn front(mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let wire = if is_sagemaker_path(path) {
        Wire::SageMaker
    } else if is_anthropic_path(path) {
        Wire::Anthropic
    } else {
        Wire::OpenAi
    };
    let refused = match crate::server::conn::render::refused(&mut req) {
        Some(e) => Err(e),
        None => super::framing::check(&req).and_then(|()| super::path::check(&req)),
    };
    let resp = match refused {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    };
    match wire {
        Wire::OpenAi => resp,
        Wire::SageMaker => crate::sagemaker::error::reshape(resp),
        Wire::Anthropic => crate::anthropic::error::reshape(resp),
    }
}
