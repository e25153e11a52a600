//! The inference handler: everything is decided by the time it runs (the
//! canonicalise layer built a [`RouteInput`]); it forwards and logs.

use std::sync::Arc;
use std::time::Instant;

use axum::Extension;
use axum::body::Body;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};

use crate::route_input::RouteInput;
use crate::state::Runtime;
use crate::telemetry;
use crate::upstream::{Forward, forward};

pub async fn handle(
    Extension(input): Extension<RouteInput>,
    Extension(runtime): Extension<Arc<Runtime>>,
    tenant: Option<Extension<crate::tenancy::Tenant>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = match uri.query() {
        Some(q) => format!("{}?{q}", input.route.upstream_path()),
        None => input.route.upstream_path().to_owned(),
    };
    // The canonicalise layer left a streamed upload as the body; JSON routes
    // forward `input.body` (what admission may have salted).
    let upload = input.upload.then_some(body);
    let tenant = tenant.map_or_else(|| "anonymous".into(), |t| t.0.id.clone());
    send(
        &runtime,
        input,
        &path,
        reqwest::Method::POST,
        &headers,
        upload,
        &tenant,
    )
    .await
}

/// Forward one request and log where it went.
pub async fn send(
    runtime: &Runtime,
    input: RouteInput,
    path: &str,
    method: reqwest::Method,
    headers: &HeaderMap,
    upload: Option<Body>,
    tenant: &str,
) -> Response {
    let started = Instant::now();
    let api = input.route.label();
    let endpoint = input.endpoint.name().to_owned();
    let key = input.key;
    let request_id = headers
        .get(crate::api::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let result = forward(Forward {
        runtime,
        path,
        method,
        headers,
        upload,
        input,
    })
    .await;
    let response = match result {
        Ok((resp, outcome)) => {
            tracing::info!(
                request_id, tenant = %tenant, endpoint, api, instance = %outcome.instance.id,
                // As in kvgate_routing_decisions_total: a later attempt is a failover.
                reason = if outcome.attempts > 1 { "failover" } else { outcome.reason.as_str() },
                attempts = outcome.attempts,
                key = format_args!("{key:016x}"), status = resp.status().as_u16(),
                headers_ms = started.elapsed().as_secs_f64() * 1e3,
                "routed"
            );
            resp
        }
        Err(e) => {
            tracing::warn!(request_id, tenant = %tenant, endpoint, api, error = %e, "not routed");
            telemetry::request_duration(&endpoint, api, started.elapsed());
            e.into_response()
        }
    };
    // The duration of a forwarded request is recorded when its body ends.
    telemetry::request_done(&endpoint, api, response.status().as_u16());
    response
}
