//! Authentication: puts the caller's [`Tenant`] into request extensions, or
//! answers 401 with `WWW-Authenticate`. Applied to every route except the
//! open allow-list (`/health`, `/ready`, `/metrics`) in [`crate::api::router`].
//!
//! This layer is the only source of a [`Tenant`]: nothing a client sends in
//! a body or another header can name one, so tenants can't merge by choice.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

pub async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let verdict = state.runtime.load().tenancy.authenticate(req.headers());
    match verdict {
        Ok(tenant) => {
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}
