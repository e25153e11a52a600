//! Admin authorization for `/admin/*`: the `admin.token` bearer token, never
//! a tenant credential (403 while no token is configured, 401 without it).
//! The check is in [`crate::tenancy::admin::authorize`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::fleet::AppState;

pub async fn require_admin(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let verdict = {
        let rt = state.runtime.load();
        crate::tenancy::admin::authorize(rt.config.admin.as_ref(), req.headers())
    };
    match verdict {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}
