//! The end of the inference pipeline: an admitted request waits for room in
//! its endpoint's fair queue ([`wait_for_room`]), is forwarded, and its
//! outcome is logged ([`forward_logged`]).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use crate::fleet::Runtime;
use crate::request::RouteInput;
use crate::route::Route;
use crate::upstream::{Forward, forward};

/// How the answer goes back to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI routes and SageMaker's `invocations`: the upstream's answer as is.
    Plain,
    /// SageMaker's `invocations-response-stream`: re-framed as an event stream.
    EventStream,
}

impl Wire {
    /// The wire of an inference route's path template.
    pub fn of_template(template: &str) -> Self {
        if template.ends_with("-response-stream") {
            Self::EventStream
        } else {
            Self::Plain
        }
    }
}

/// When the endpoint queues (`queue.enabled`) and every instance is
/// saturated, wait in its fair queue; generation routes only (the others
/// are cheap and pass). The tenant's output tokens are counted as its
/// service when the response ends.
pub(super) async fn wait_for_room(
    runtime: &Runtime,
    input: &RouteInput,
    headers: &HeaderMap,
    tenant: &str,
) -> Result<Option<crate::fleet::queue::Reservation>, crate::error::ApiError> {
    let queue = &runtime.config.queue;
    if !input.route.uses_strategy() {
        return Ok(None);
    }
    let limits = runtime.tenancy.limits(tenant);
    // Judged whether or not the queue is on: a priority the tenant may not
    // ask for is refused the same way either way.
    let priority = crate::tenancy::priority::asked(
        headers,
        &queue.priority_header,
        limits.priority,
        limits.priority_header,
    )?;
    if !queue.enabled {
        return Ok(None);
    }
    let ep = &input.endpoint;
    let reservation = ep
        .queue
        .enter(crate::fleet::queue::Ask {
            tenant,
            priority,
            weight: limits.weight,
            prompt_tokens: input.prompt_tokens,
        })
        .await?;
    if let Some(admission) = &input.admission {
        let (q, t, w) = (Arc::clone(&ep.queue), tenant.to_owned(), limits.weight);
        admission.on_served(move |tokens| q.charge_output(&t, w, tokens));
    }
    Ok(reservation)
}

/// Forward one request and log where it went.
pub async fn forward_logged(
    runtime: &Runtime,
    input: RouteInput,
    (path, method): (&str, axum::http::Method),
    (headers, until_claimed): (&HeaderMap, Option<Box<dyn std::fmt::Debug + Send + Sync>>),
    upload: Option<Body>,
    tenant: &Arc<str>,
    wire: Wire,
) -> Response {
    let started = Instant::now();
    let route = input.route;
    let api = route.label();
    let endpoint = Arc::clone(&input.endpoint);
    let key = input.key;
    let request_id = || {
        headers
            .get(crate::api::REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let result = forward(Forward {
        runtime,
        tenant,
        path,
        method,
        headers,
        upload,
        input,
        keepalive: wire == Wire::Plain,
        until_claimed,
    })
    .await;
    // Counted in kvgate_requests_total by the count layer, refusals alike.
    match result {
        Ok((mut resp, outcome)) => {
            if runtime.config.server.access_log {
                tracing::info!(
                    target: "kvgate::access",
                    request_id = request_id(), tenant = %tenant, endpoint = endpoint.name(), api,
                    instance = %outcome.instance.id,
                    // As in kvgate_routing_decisions_total: a later attempt is a failover.
                    reason = if outcome.attempts > 1 { "failover" } else { outcome.reason.as_str() },
                    attempts = outcome.attempts,
                    key = format_args!("{key:016x}"), status = resp.status().as_u16(),
                    headers_ms = started.elapsed().as_secs_f64() * 1e3,
                    "routed"
                );
            }
            // The duration of a forwarded request is recorded when its body ends.
            if route == Route::Native {
                crate::sagemaker::invoked_variant(&mut resp, &outcome.instance.id);
            }
            if wire == Wire::EventStream && resp.status().is_success() {
                resp = crate::sagemaker::eventstream::into_event_stream(resp);
            }
            resp
        }
        Err(e) => {
            tracing::warn!(request_id = request_id(), tenant = %tenant, endpoint = endpoint.name(), api, error = %e, "not routed");
            endpoint.series.duration(route, started.elapsed());
            e.into_response()
        }
    }
}
