//! The route table and the layer stack, assembled in one place.

mod admin;
mod proxy;

use std::sync::Arc;

use axum::Router;
use axum::http::HeaderName;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::error::{ApiError, ErrorKind};
use crate::middleware::{auth, canonicalise};
use crate::state::AppState;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The whole HTTP surface of the gateway.
pub fn router(state: Arc<AppState>) -> Router {
    // Inference routes: the body is parsed and keyed before the handler runs.
    let inference = Router::new()
        .route("/v1/chat/completions", post(proxy::handle))
        .route("/v1/completions", post(proxy::handle))
        .route("/endpoints/{endpoint}/invocations", post(proxy::handle))
        .route(
            "/endpoints/{endpoint}/invocations-response-stream",
            post(proxy::handle),
        )
        .route_layer(from_fn_with_state(
            Arc::clone(&state),
            canonicalise::canonicalise,
        ));

    // Everything here is authenticated; the open allow-list is merged below.
    let authenticated = Router::new()
        .merge(inference)
        .route("/v1/models", get(admin::models))
        .route("/admin/explain/{*path}", post(admin::explain))
        .route_layer(from_fn(auth::authenticate));

    let open = Router::new()
        .route("/health", get(admin::health))
        .route("/ready", get(admin::ready))
        .route("/metrics", get(admin::metrics));

    Router::new()
        .merge(authenticated)
        .merge(open)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                // Keep the client's x-request-id or make one, before anything logs.
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                // One span per request, carrying the id.
                .layer(TraceLayer::new_for_http())
                // Echo the id on every response, errors included.
                .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
        )
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorKind::RouteNotFound,
        format!("no route for {}", uri.path()),
    )
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorKind::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}
