//! Authentication: puts the caller's [`Tenant`] into request extensions, or
//! answers 401 with `WWW-Authenticate`. Applied to every route except the
//! open allow-list (`/health`, `/ready`, `/metrics`) in [`crate::api::router`].
//!
//! This layer is the only source of a [`Tenant`]: nothing a client sends in
//! a body or another header can name one, so tenants can't merge by choice.
//!
//! A SigV4-signed request's signature covers its body, so that caller is not
//! a tenant until the body is read: here, under `server.timeouts.body_read_ms`
//! and `max_body_bytes`, holding one of `auth.sigv4.max_unverified_uploads`
//! permits instead of any of the tenant's quota; the verified body is then
//! handed on in memory.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::body_limit::read_limited;
use crate::error::ApiError;
use crate::fleet::{AppState, Runtime};
use crate::tenancy::Tenant;
use crate::tenancy::sigv4::Sigv4Verifier;

pub async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let runtime = state.runtime.load_full();
    if let Some(verifier) = runtime.tenancy.sigv4_for(req.headers()) {
        let verifier = Arc::clone(verifier);
        return match signed(&runtime, &verifier, req).await {
            Ok(req) => next.run(req).await,
            Err(e) => e.into_response(),
        };
    }
    let verdict = runtime.tenancy.authenticate(req.headers());
    match verdict {
        Ok(tenant) => {
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// Read and verify a SigV4-signed request; the request, its body in memory,
/// with its tenant.
async fn signed(
    runtime: &Runtime,
    verifier: &Sigv4Verifier,
    req: Request,
) -> Result<Request, ApiError> {
    let pending = verifier.begin(req.headers(), SystemTime::now())?;
    let (mut parts, body) = req.into_parts();
    let server = &runtime.config.server;
    let bytes = read_limited(
        &parts.headers,
        body,
        server.max_body_bytes,
        server.timeouts.body_read,
    )
    .await?;
    let id = pending.verify(&parts.method, &parts.uri, &parts.headers, &bytes)?;
    parts.extensions.insert(Tenant { id });
    Ok(Request::from_parts(parts, Body::from(bytes)))
}
