//! The route table and the layer stack, assembled in one place.

mod admin;
mod instances;
mod metrics;
pub mod middleware;
pub mod pipeline;
mod proxy;
mod request_id;
mod responses;

use std::sync::Arc;

use axum::Router;
use axum::http::HeaderName;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{MethodRouter, get, post};
use tower::ServiceBuilder;
use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::api::middleware::admin as admin_auth;
use crate::error::{ApiError, ErrorKind};
use crate::fleet::AppState;
use crate::route::Route;

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

/// The route table: the inference paths of [`crate::route::PATHS`], served
/// by the pipeline (the Responses API's by-id routes by their own handler),
/// and the gateway's own routes, listed here.
fn table() -> Vec<(&'static str, &'static str, Access, MethodRouter<State>)> {
    use Access::*;
    let inference = crate::route::PATHS.iter().map(|&(method, path, route)| {
        let handler = match route {
            Route::ResponseById => on(method, responses::by_id),
            _ => on(method, pipeline::infer),
        };
        let access = match route {
            Route::ResponseById => Authenticated,
            _ => Inference,
        };
        (method, path, access, handler)
    });
    let own = vec![
        ("get", "/v1/models", Authenticated, get(admin::models)),
        (
            "get",
            "/v1/models/{*model}",
            Authenticated,
            get(admin::model),
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
    ];
    inference.chain(own).collect()
}

/// A handler on one method, named as the table names it.
fn on<H, T>(method: &str, handler: H) -> MethodRouter<State>
where
    H: axum::handler::Handler<T, State>,
    T: 'static,
{
    match method {
        "get" => get(handler),
        "delete" => axum::routing::delete(handler),
        _ => post(handler),
    }
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
    // The pipeline's steps (count, auth, claim, analyse, admit) run inside
    // its handler: see `pipeline`.
    let inference = group(Access::Inference);

    // Everything here is authenticated; the open allow-list is merged below.
    let authenticated = group(Access::Authenticated)
        .route_layer(from_fn_with_state(
            Arc::clone(&state),
            pipeline::auth::layer,
        ))
        // The Responses API's by-id routes are counted like inference; the
        // rest of this group (model lists) match no API and pass untouched.
        .route_layer(from_fn_with_state(
            Arc::clone(&state),
            pipeline::count::layer,
        ))
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
        // The console: its own login, security headers and sampler.
        .merge(crate::console::router(&state))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                // Keep the client's x-request-id or make one, before anything logs.
                .layer(SetRequestIdLayer::new(REQUEST_ID, request_id::MakeId))
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
