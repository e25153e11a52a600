//! The analysis step: read the body once (capped), parse it strictly,
//! resolve the endpoint and compute the routing key
//! ([`crate::request::analyse_route`]). Bad input stops here with a 4xx and
//! never reaches an upstream. An audio upload is routed by its form's
//! `model` alone and streamed on as it arrives.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Analysed, Claimed};
use crate::api::middleware::body_limit::read_limited;
use crate::error::ApiError;
use crate::fleet::Runtime;
use crate::route::Route;

pub async fn analyse(
    runtime: &Arc<Runtime>,
    claimed: Claimed,
    route: Route,
    template: &str,
    params: &HashMap<String, String>,
) -> Result<Analysed, ApiError> {
    let Claimed {
        tenant,
        held,
        request,
    } = claimed;
    let (parts, body) = request.into_parts();
    let server = &runtime.config.server;
    let (limit, timeout) = (server.max_body_bytes, server.timeouts.body_read);
    if route == Route::Transcriptions {
        let (model, body) =
            crate::openai::multipart::model_of(&parts.headers, body, limit, timeout).await?;
        let input = crate::request::input::upload(runtime, route, model)?;
        return Ok(Analysed {
            tenant,
            held,
            parts,
            input,
            upload: Some(body),
        });
    }
    let bytes = read_limited(&parts.headers, body, limit, timeout).await?;
    // The container contract's `/invocations` names no endpoint: the first one.
    let endpoint = match params.get("endpoint") {
        Some(name) => Some(name.as_str()),
        None if template == "/invocations" => runtime.endpoints.first().map(|e| e.name()),
        None => None,
    };
    let analysis =
        crate::request::analyse_route(runtime, route, endpoint, &parts.headers, bytes, &tenant.id)?;
    Ok(Analysed {
        tenant,
        held,
        parts,
        input: analysis.input,
        upload: None,
    })
}
