//! The live console, `GET /console`: the fleet, its caches, the tenants and
//! every routing decision, in a browser, served by the gateway itself from
//! files embedded in the binary.
//!
//! ```text
//! /console                      the page (200), or the login form (401)
//! /console/login, /logout       POST: set or clear the session cookie
//! /console/assets/{file}        the script and the stylesheet
//! /console/api/state            JSON: everything the page shows, now
//! /console/api/events           SSE: hello, then state + new decisions each second
//! /console/api/decisions/{seq}  JSON: one decision's explain view
//! /console/api/config           JSON: the running config, secrets redacted
//! ```
//!
//! Every route but the page, the login and the assets needs the admin token
//! (`auth.rs`). The page holds no state of its own: a refresh shows the same.

pub mod assets;
mod auth;
mod decisions;
pub mod events;
mod snapshot;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{from_fn_with_state, map_response};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::json;

use crate::error::{ApiError, ErrorKind};
use crate::fleet::AppState;

/// The console's routes, with their own security headers and sampler.
pub fn router(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    let data = Router::new()
        .route("/console/api/state", get(current))
        .route("/console/api/events", get(events::stream))
        .route("/console/api/decisions/{seq}", get(decision))
        .route("/console/api/config", get(config))
        // Everything above needs the admin token.
        .route_layer(from_fn_with_state(Arc::clone(state), auth::require));
    Router::new()
        .route("/console", get(page))
        .route("/console/login", post(auth::login))
        .route("/console/logout", post(auth::logout))
        .route("/console/assets/{file}", get(assets::file))
        .merge(data)
        .layer(Extension(Arc::new(events::Hub::default())))
        // CSP, nosniff, no framing, no caching: on every console answer.
        .layer(map_response(assets::secure))
}

/// The page for whoever holds the token; the login form (401) for others.
async fn page(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    match auth::check(&state, &headers) {
        Ok(()) => assets::index(),
        Err(e) if e.kind == ErrorKind::Unauthorized => {
            assets::login_page(StatusCode::UNAUTHORIZED, false)
        }
        Err(e) => e.into_response(),
    }
}

async fn current(State(state): State<Arc<AppState>>) -> Response {
    Json(events::full(&state).0).into_response()
}

async fn decision(State(state): State<Arc<AppState>>, Path(seq): Path<u64>) -> Response {
    let rt = state.runtime.load();
    match rt.live.decisions.get(seq) {
        Some(d) => Json(decisions::explain(&rt, &d)).into_response(),
        None => ApiError::new(
            ErrorKind::RouteNotFound,
            format!(
                "decision {seq} is no longer in the last {}",
                crate::telemetry::live::decisions::CAPACITY
            ),
        )
        .into_response(),
    }
}

/// The running config as the gateway holds it (`Debug`): every secret is
/// a type that prints redacted (`Secret(..)`, `AdminToken(..)`, API keys as
/// a count, header values marked sensitive), and when and by what it was
/// last reloaded.
async fn config(State(state): State<Arc<AppState>>) -> Response {
    let rt = state.runtime.load();
    let reload = rt.live.last_reload();
    Json(json!({
        "reload": {"at_ms": reload.at_ms, "by": reload.by, "count": reload.count},
        "text": format!("{:#?}", rt.config),
    }))
    .into_response()
}
