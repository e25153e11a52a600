//! Authentication: the caller's [`Tenant`], or a 401 with `WWW-Authenticate`.
//! Every route but the open allow-list (`/health`, `/ready`, `/metrics`) and
//! the admin routes passes it: inference routes as the pipeline's first step,
//! the others as a layer ([`crate::api::router`]).
//!
//! This is the only source of a [`Tenant`]: nothing a client sends in
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

use super::Caller;
use crate::api::middleware::body_limit::read_limited;
use crate::error::ApiError;
use crate::fleet::{AppState, Runtime};
use crate::tenancy::Tenant;
use crate::tenancy::sigv4::Sigv4Verifier;

/// Authenticate a request: its tenant from the credential in its headers,
/// or, for a SigV4-signed one, from the signature over headers and body.
pub async fn authenticate(runtime: &Runtime, req: Request) -> Result<Caller, ApiError> {
    if let Some(verifier) = runtime.tenancy.sigv4_for(req.headers()) {
        let verifier = Arc::clone(verifier);
        return signed(runtime, &verifier, req).await;
    }
    let tenant = runtime.tenancy.authenticate(req.headers())?;
    Ok(Caller {
        tenant,
        request: req,
    })
}

/// The same as a layer, for the authenticated routes that are not inference
/// (model lists, the Responses API's by-id routes): the tenant goes into
/// request extensions.
pub async fn layer(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let runtime = state.runtime.load_full();
    match authenticate(&runtime, req).await {
        Ok(Caller {
            tenant,
            mut request,
        }) => {
            request.extensions_mut().insert(tenant);
            next.run(request).await
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
) -> Result<Caller, ApiError> {
    let pending = verifier.begin(req.headers(), SystemTime::now())?;
    let (parts, body) = req.into_parts();
    let server = &runtime.config.server;
    let bytes = read_limited(
        &parts.headers,
        body,
        server.max_body_bytes,
        server.timeouts.body_read,
    )
    .await?;
    let id = pending.verify(&parts.method, &parts.uri, &parts.headers, &bytes)?;
    Ok(Caller {
        tenant: Tenant { id },
        request: Request::from_parts(parts, Body::from(bytes)),
    })
}
