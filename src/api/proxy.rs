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

/// How the answer goes back to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// OpenAI routes and SageMaker's `invocations`: the upstream's answer as is.
    Plain,
    /// SageMaker's `invocations-response-stream`: re-framed as an event stream.
    EventStream,
}

pub async fn handle(
    input: Extension<RouteInput>,
    runtime: Extension<Arc<Runtime>>,
    tenant: Option<Extension<crate::tenancy::Tenant>>,
    headers: HeaderMap,
) -> Response {
    run(input, runtime, tenant, headers, Wire::Plain).await
}

/// `POST /endpoints/{name}/invocations-response-stream`.
pub async fn handle_stream(
    input: Extension<RouteInput>,
    runtime: Extension<Arc<Runtime>>,
    tenant: Option<Extension<crate::tenancy::Tenant>>,
    headers: HeaderMap,
) -> Response {
    run(input, runtime, tenant, headers, Wire::EventStream).await
}

async fn run(
    Extension(input): Extension<RouteInput>,
    Extension(runtime): Extension<Arc<Runtime>>,
    tenant: Option<Extension<crate::tenancy::Tenant>>,
    headers: HeaderMap,
    wire: Wire,
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
        keepalive: wire == Wire::Plain,
    })
    .await;
    // Counted in kvgate_requests_total by the count layer, refusals alike.
    match result {
        Ok((mut resp, outcome)) => {
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
            if api == Api::Native {
                crate::sagemaker::invoked_variant(&mut resp, &outcome.instance.id);
            }
            if wire == Wire::EventStream && resp.status().is_success() {
                resp = crate::sagemaker::eventstream::into_event_stream(resp);
            }
            resp
        }
        Err(e) => {
            tracing::warn!(request_id, tenant = %tenant, endpoint, api = api_label(api), error = %e, "not routed");
            telemetry::request_duration(&endpoint, api_label(api), started.elapsed());
            e.into_response()
        }
    }
}
