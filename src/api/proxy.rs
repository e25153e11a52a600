//! The inference handler: everything is decided by the time it runs (the
//! canonicalise layer built a [`RouteInput`]); it forwards and logs.

use std::sync::Arc;
use std::time::Instant;

use axum::Extension;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvgate_prefix::Api;

use crate::route_input::{RouteInput, api_label};
use crate::state::Runtime;
use crate::telemetry;
use crate::upstream::{Forward, forward};

/// The instance path each API is sent to.
fn upstream_path(api: Api) -> &'static str {
    match api {
        Api::Chat => "/v1/chat/completions",
        Api::Completions => "/v1/completions",
        Api::Native => "/invocations",
    }
}

pub async fn handle(
    Extension(input): Extension<RouteInput>,
    Extension(runtime): Extension<Arc<Runtime>>,
    tenant: Option<Extension<crate::tenancy::Tenant>>,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let tenant = tenant.map_or_else(|| "anonymous".into(), |t| t.0.id.clone());
    let api = input.api;
    let endpoint = input.endpoint.name().to_owned();
    let key = input.key;
    let request_id = headers
        .get(crate::api::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let result = forward(Forward {
        runtime: &runtime,
        path: upstream_path(api),
        headers: &headers,
        input,
    })
    .await;
    // Counted in kvgate_requests_total by the count layer, refusals alike.
    match result {
        Ok((resp, outcome)) => {
            tracing::info!(
                request_id, tenant = %tenant, endpoint, api = api_label(api), instance = %outcome.instance.id,
                // As in kvgate_routing_decisions_total: a later attempt is a failover.
                reason = if outcome.attempts > 1 { "failover" } else { outcome.reason.as_str() },
                attempts = outcome.attempts,
                key = format_args!("{key:016x}"), status = resp.status().as_u16(),
                headers_ms = started.elapsed().as_secs_f64() * 1e3,
                "routed"
            );
            // The duration of a forwarded request is recorded when its body ends.
            resp
        }
        Err(e) => {
            tracing::warn!(request_id, tenant = %tenant, endpoint, api = api_label(api), error = %e, "not routed");
            telemetry::request_duration(&endpoint, api_label(api), started.elapsed());
            e.into_response()
        }
    }
}
