//! What a body says about where it goes, before its prompt is read: the
//! endpoint (by `model`, or the path's for SageMaker's routes), whether it
//! streams, the partition it asks for (`prompt_cache_key`, the SageMaker
//! prefix-aware-id header), an Anthropic session hint, and a Responses
//! follow-up's pinned instance.

use std::sync::Arc;

use axum::http::HeaderMap;
use bytes::Bytes;
use kvgate_prefix::Api;
use serde_json::Value;

use super::PREFIX_AWARE_ID_HEADER;
use crate::error::{ApiError, ErrorKind};
use crate::fleet::{Endpoint, Runtime};
use crate::openai::response_id::IdScope;
use crate::route::{Placement, Route};

/// The body's routing fields.
pub struct Fields {
    pub endpoint: Arc<Endpoint>,
    pub model: Option<String>,
    pub stream: bool,
    /// The body's partition (`prompt_cache_key`); the header's wins over it.
    pub partition: Option<String>,
    /// Anthropic's `metadata.user_id`: the session the key is taken from.
    pub session: Option<String>,
}

impl Fields {
    pub fn read(
        runtime: &Runtime,
        route: Route,
        endpoint_name: Option<&str>,
        value: &Value,
    ) -> Result<Self, ApiError> {
        match route.api() {
            Api::Native => native(runtime, endpoint_name, value),
            api => openai_like(runtime, route, api, value),
        }
    }
}

/// SageMaker's routes name their endpoint; the body may be any JSON.
fn native(runtime: &Runtime, name: Option<&str>, value: &Value) -> Result<Fields, ApiError> {
    let name = name.unwrap_or_default();
    let ep = runtime.endpoint(name).ok_or_else(|| {
        ApiError::new(
            ErrorKind::EndpointNotFound,
            format!("endpoint {name:?} does not exist"),
        )
    })?;
    Ok(Fields {
        endpoint: Arc::clone(ep),
        model: value
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
        stream: value
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        partition: None,
        session: None,
    })
}

/// OpenAI's and Anthropic's routes: an object whose `model` names the endpoint.
fn openai_like(
    runtime: &Runtime,
    route: Route,
    api: Api,
    value: &Value,
) -> Result<Fields, ApiError> {
    let obj = value
        .as_object()
        .ok_or_else(|| ApiError::invalid("body", "the request body must be a JSON object"))?;
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
        None => return Err(ApiError::invalid("model", "`model` is required")),
    };
    let ep = runtime
        .endpoint_for_model(&model)
        .ok_or_else(|| ApiError::model_not_found(&model))?;
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("stream", "`stream` must be a boolean")),
    };
    if route == Route::Messages {
        crate::anthropic::request::check_max_tokens(obj)?;
    }
    let session = match api {
        Api::Messages => crate::anthropic::request::session(obj)?,
        _ => None,
    };
    let partition = match obj.get("prompt_cache_key") {
        _ if api == Api::Messages => None,
        None | Some(Value::Null) => None,
        // Control characters (NUL above all) could blur the key's
        // field boundaries; no legitimate user or session id has them.
        Some(Value::String(s)) if !s.chars().any(char::is_control) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt_cache_key",
                "`prompt_cache_key` must be a string without control characters",
            ));
        }
    };
    Ok(Fields {
        endpoint: Arc::clone(ep),
        model: Some(model),
        stream,
        partition,
        session,
    })
}

/// How the instance is chosen, and the body to forward: a Responses
/// follow-up is pinned to the instance holding its `previous_response_id`,
/// which is replaced by the upstream's own id.
pub fn placement(
    route: Route,
    ids: Option<&IdScope>,
    endpoint: &Endpoint,
    value: &Value,
    body: Bytes,
) -> Result<(Placement, Bytes), ApiError> {
    let previous = value.get("previous_response_id").filter(|v| !v.is_null());
    if let (Some(scope), Some(prev)) = (ids, previous) {
        let (pinned, upstream_body) =
            super::input::previous_response(scope, endpoint, prev, &body)?;
        return Ok((Placement::Pinned(pinned), upstream_body));
    }
    let placement = if route.uses_strategy() {
        Placement::Policy
    } else {
        Placement::Load
    };
    Ok((placement, body))
}

/// The partition from the prefix-aware-id header, validated.
pub fn header_partition(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut all = headers.get_all(PREFIX_AWARE_ID_HEADER).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        // "First one wins" would route by one and forward both.
        return Err(ApiError::invalid(
            PREFIX_AWARE_ID_HEADER,
            "X-Amzn-SageMaker-Prefix-Aware-Id must be sent once",
        ));
    }
    let s = v.to_str().ok().filter(|s| kvgate_prefix::is_valid_partition_id(s)).ok_or_else(|| {
        ApiError::invalid(
            PREFIX_AWARE_ID_HEADER,
            "X-Amzn-SageMaker-Prefix-Aware-Id must be 1-64 printable characters, the first not a space",
        )
    })?;
    Ok(Some(s.to_owned()))
}
