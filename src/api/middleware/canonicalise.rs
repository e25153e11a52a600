//! The canonicalise layer: read the body once (capped), parse it strictly,
//! resolve the endpoint, compute the routing key, and hand the handler a
//! [`RouteInput`] in request extensions. Bad input stops here with a 4xx and
//! never reaches an upstream.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::body_limit::read_limited;
use crate::error::{ApiError, ErrorKind};
use crate::fleet::AppState;
use crate::request::analyse_route;
use crate::route::Route;
use crate::tenancy::Tenant;

pub async fn canonicalise(
    State(state): State<Arc<AppState>>,
    matched: MatchedPath,
    params: Option<Path<HashMap<String, String>>>,
    req: Request,
    next: Next,
) -> Response {
    let params = params.map(|Path(p)| p).unwrap_or_default();
    match prepare(&state, matched.as_str(), &params, req).await {
        Ok(req) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

async fn prepare(
    state: &AppState,
    route: &str,
    params: &HashMap<String, String>,
    req: Request,
) -> Result<Request, ApiError> {
    let container = route == "/invocations";
    let route = Route::of_template(route)
        .ok_or_else(|| ApiError::new(ErrorKind::Internal, format!("no API for route {route}")))?;
    let runtime = state.runtime.load_full();
    let (mut parts, body) = req.into_parts();
    let server = &runtime.config.server;
    if route == Route::Transcriptions {
        let (model, body) = crate::openai::multipart::model_of(
            &parts.headers,
            body,
            server.max_body_bytes,
            server.timeouts.body_read,
        )
        .await?;
        let input = crate::request::input::upload(&runtime, route, model)?;
        if let Some(slot) = parts.extensions.get::<super::count::EndpointSlot>() {
            slot.set(input.endpoint.name());
        }
        parts.extensions.insert(input);
        parts.extensions.insert(runtime);
        return Ok(Request::from_parts(parts, body));
    }
    let bytes = read_limited(
        &parts.headers,
        body,
        server.max_body_bytes,
        server.timeouts.body_read,
    )
    .await?;
    let tenant = parts
        .extensions
        .get::<Tenant>()
        .cloned()
        .unwrap_or_else(Tenant::anonymous);
    // The container contract's `/invocations` names no endpoint: the first one.
    let endpoint = match params.get("endpoint") {
        Some(name) => Some(name.as_str()),
        None if container => runtime.endpoints.first().map(|e| e.name()),
        None => None,
    };
    let analysis = analyse_route(
        &runtime,
        route,
        endpoint,
        &parts.headers,
        bytes.clone(),
        &tenant.id,
    )?;
    if let Some(slot) = parts.extensions.get::<super::count::EndpointSlot>() {
        slot.set(analysis.input.endpoint.name());
    }
    parts.extensions.insert(analysis.input);
    parts.extensions.insert(runtime);
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}
