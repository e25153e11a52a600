//! The route table and the layer stack, assembled in one place.

mod admin;
mod instances;
mod metrics;
pub mod middleware;
mod proxy;
mod responses;

use std::sync::Arc;

use axum::Router;
use axum::http::HeaderName;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{MethodRouter, get, post};
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::api::middleware::{admin as admin_auth, admit, auth, canonicalise, claim, count};
use crate::error::{ApiError, ErrorKind};
use crate::fleet::AppState;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Who may call a route, and what runs before its handler.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Authenticated; the body is parsed and keyed before the handler runs.
    Inference,
    /// Authenticated.
    Authenticated,
    /// The admin token (`admin.token`), never a tenant credential.
    Admin,
    /// The open allow-list: probes and scrapers.
    Open,
}

type State = Arc<AppState>;

/// The route table: every served path is here and nowhere else.
fn table() -> Vec<(&'static str, &'static str, Access, MethodRouter<State>)> {
    use Access::*;
    vec![
        (
            "post",
            "/v1/chat/completions",
            Inference,
            post(proxy::handle),
        ),
        ("post", "/v1/completions", Inference, post(proxy::handle)),
        ("post", "/v1/messages", Inference, post(proxy::handle)),
        (
            "post",
            "/v1/messages/count_tokens",
            Inference,
            post(proxy::handle),
        ),
        ("post", "/v1/responses", Inference, post(proxy::handle)),
        ("post", "/v1/embeddings", Inference, post(proxy::handle)),
        ("post", "/tokenize", Inference, post(proxy::handle)),
        ("post", "/detokenize", Inference, post(proxy::handle)),
        ("post", "/v1/score", Inference, post(proxy::handle)),
        ("post", "/v1/rerank", Inference, post(proxy::handle)),
        ("post", "/pooling", Inference, post(proxy::handle)),
        (
            "post",
            "/v1/audio/transcriptions",
            Inference,
            post(proxy::handle),
        ),
        (
            "post",
            "/endpoints/{endpoint}/invocations",
            Inference,
            post(proxy::handle),
        ),
        (
            "post",
            "/endpoints/{endpoint}/invocations-response-stream",
            Inference,
            post(proxy::handle_stream),
        ),
        // SageMaker's container contract, so kvgate can itself be the inference
        // container: `/invocations` goes to the first configured endpoint.
        ("post", "/invocations", Inference, post(proxy::handle)),
        ("get", "/v1/models", Authenticated, get(admin::models)),
        (
            "get",
            "/v1/models/{*model}",
            Authenticated,
            get(admin::model),
        ),
        (
            "get",
            "/v1/responses/{id}",
            Authenticated,
            get(responses::by_id),
        ),
        (
            "delete",
            "/v1/responses/{id}",
            Authenticated,
            axum::routing::delete(responses::by_id),
        ),
        (
            "post",
            "/v1/responses/{id}/cancel",
            Authenticated,
            post(responses::by_id),
        ),
        (
            "post",
            "/admin/explain/{*path}",
            Admin,
            post(admin::explain),
        ),
        ("get", "/admin/instances", Admin, get(instances::list)),
        (
            "post",
            "/admin/instances/drain",
            Admin,
            post(instances::drain),
        ),
        ("get", "/health", Open, get(admin::health)),
        ("get", "/ready", Open, get(admin::ready)),
        ("get", "/ping", Open, get(admin::ready)),
        ("get", "/metrics", Open, get(admin::metrics)),
    ]
}

/// Every served (method, path template), for the OpenAPI document's test.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    table().into_iter().map(|(m, p, _, _)| (m, p)).collect()
}

fn group(access: Access) -> Router<State> {
    table()
        .into_iter()
        .filter(|(_, _, a, _)| *a == access)
        .fold(Router::new(), |r, (_, path, _, route)| r.route(path, route))
}

/// The whole HTTP surface of the gateway.
pub fn router(state: Arc<AppState>) -> Router {
    let inference = group(Access::Inference)
        // Tenant limits, model allow-list and cache salt; needs the parsed body,
        // so it sits inside canonicalise (a later route_layer runs first).
        .route_layer(from_fn(admit::admit))
        .route_layer(from_fn_with_state(
            Arc::clone(&state),
            canonicalise::canonicalise,
        ))
        // The tenant's concurrency slot, from the headers: before the body is
        // read (a SigV4 tenant is known only once auth has verified the body).
        .route_layer(from_fn_with_state(Arc::clone(&state), claim::claim))
        // 401 before anything reads the body.
        .route_layer(from_fn_with_state(Arc::clone(&state), auth::authenticate))
        // Every answer counted, refusals and clients that left included.
        .route_layer(from_fn_with_state(Arc::clone(&state), count::count));

    // Everything here is authenticated; the open allow-list is merged below.
    let authenticated = group(Access::Authenticated)
        .route_layer(from_fn_with_state(Arc::clone(&state), auth::authenticate))
        // The Responses API's by-id routes are counted like inference; the
        // rest of this group (model lists) match no API and pass untouched.
        .route_layer(from_fn_with_state(Arc::clone(&state), count::count))
        .merge(inference);

    // Operators only: admin routes see every tenant's traffic.
    let admin = group(Access::Admin).route_layer(from_fn_with_state(
        Arc::clone(&state),
        admin_auth::require_admin,
    ));

    let open = group(Access::Open);

    Router::new()
        .merge(authenticated)
        .merge(admin)
        .merge(open)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                // Keep the client's x-request-id or make one, before anything logs.
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                // One span per request, carrying the id (and the client's trace
                // context when OpenTelemetry is on).
                .layer(TraceLayer::new_for_http().make_span_with(crate::telemetry::otel::MakeSpan))
                // Echo the id on every response, errors included.
                .layer(PropagateRequestIdLayer::new(REQUEST_ID))
                // Refusals before routing, and SageMaker's error shape on its
                // routes (one layer: middleware/front.rs).
                .layer(from_fn(crate::api::middleware::front::front)),
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
