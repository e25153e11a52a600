//! The tenant's concurrency slot, taken as soon as the credential in the
//! headers is verified (JWT, API key) and before the body is read: a tenant's
//! slow uploads count against its own `max_concurrency`, so they cannot pile
//! up past it (a 429 comes before any of the body is read). The slot is
//! handed to admission ([`super::admit`]) and held until the response ends;
//! a request refused before that drops it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::fleet::AppState;
use crate::tenancy::Tenant;

pub async fn claim(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let tenant = req
        .extensions()
        .get::<Tenant>()
        .cloned()
        .unwrap_or_else(Tenant::anonymous);
    let tenancy = Arc::clone(&state.runtime.load().tenancy);
    let held = tenancy.hold(&tenant).await;
    match held {
        Ok(held) => {
            req.extensions_mut().insert(held);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}
