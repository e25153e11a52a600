//! The router's outermost layer, after the request id and the trace span:
//! the checks every request gets before routing, in one pass rather than a
//! layer each (each `from_fn` layer boxes the rest of the stack per request).
//!
//! In order: what the connection guard refused before hyper saw it
//! (`conn::render`), framing that could smuggle a request
//! ([`super::framing`]), a path the route extractors cannot decode
//! ([`super::path`]); then the request goes on. On SageMaker's routes every
//! error, whichever of these or of the layers below raised it, is re-rendered
//! in SageMaker's shape (`sagemaker::error`).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::sagemaker::error::{is_sagemaker_path, reshape};

pub async fn front(mut req: Request, next: Next) -> Response {
    let sagemaker = is_sagemaker_path(req.uri().path());
    let refused = match crate::conn::render::refused(&mut req) {
        Some(e) => Err(e),
        None => super::framing::check(&req).and_then(|()| super::path::check(&req)),
    };
    let resp = match refused {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    };
    if sagemaker { reshape(resp) } else { resp }
}
