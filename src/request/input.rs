//! Route inputs the Responses API and uploads need beyond a chat body's: a
//! follow-up pinned to the instance its `previous_response_id` names, and an
//! upload routed by its form's `model` alone; and the prompt of each route
//! in the shape the windows read.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::error::{ApiError, ErrorKind};
use crate::fleet::{Endpoint, Runtime};
use crate::openai::response_id::IdScope;
use crate::request::RouteInput;
use crate::route::{Placement, Route};

/// The prompt a route's body is windowed by, in the shape its [`kvgate_prefix::Api`] reads.
pub fn prompt_of(route: Route, value: &Value) -> Result<std::borrow::Cow<'_, Value>, ApiError> {
    use std::borrow::Cow;
    let shape = |e: crate::openai::responses::Shape| ApiError::invalid(&e.param, e.message);
    Ok(match route {
        Route::Responses => Cow::Owned(crate::openai::responses::as_chat(value).map_err(shape)?),
        // vLLM's chat-style embeddings carry `messages`, windowed as completions' prompt.
        Route::Embeddings if value.get("messages").is_some() => Cow::Owned(
            serde_json::json!({"prompt": kvgate_prefix::chat_window(value, usize::MAX).map_err(|e| ApiError::invalid(&e.param, e.message))?}),
        ),
        Route::Embeddings => {
            Cow::Owned(crate::openai::responses::embeddings_prompt(value).map_err(shape)?)
        }
        _ => Cow::Borrowed(value),
    })
}

/// The input of a streamed upload, routed by its form's `model` alone. Its
/// tokens are not estimated from its size (audio is not text): the tenant is
/// charged what the upstream reports, if it reports usage.
pub fn upload(runtime: &Runtime, route: Route, model: String) -> Result<RouteInput, ApiError> {
    let endpoint = runtime
        .endpoint_for_model(&model)
        .ok_or_else(|| ApiError::model_not_found(&model))?;
    Ok(RouteInput {
        upload: true,
        model: Some(model),
        ..RouteInput::unkeyed(route, Arc::clone(endpoint), Placement::Load)
    })
}

/// A follow-up's `previous_response_id`: the instance that holds it, and the
/// body with kvgate's id replaced by the upstream's. An id this tenant was not
/// issued, or one whose instance has left the endpoint, is a 404.
pub fn previous_response(
    scope: &IdScope,
    endpoint: &Endpoint,
    prev: &Value,
    body: &Bytes,
) -> Result<(String, Bytes), ApiError> {
    let not_found = |id: &str, why: &str| {
        ApiError::new(
            ErrorKind::ResponseNotFound,
            format!("Previous response with id '{id}' not found{why}."),
        )
        .with_param("previous_response_id")
    };
    let id = match prev {
        Value::String(s) => s,
        _ => {
            return Err(ApiError::invalid(
                "previous_response_id",
                "`previous_response_id` must be a string",
            ));
        }
    };
    let issued = scope.decode(id).ok_or_else(|| not_found(id, ""))?;
    // Issued to this tenant, so it named an instance: one that has left.
    let ids = endpoint.instances.iter().map(|i| i.id.as_str());
    let instance = scope
        .instance_of(&issued, endpoint.name(), ids)
        .ok_or_else(|| {
            not_found(
                id,
                ": the instance that stored it is no longer part of the endpoint",
            )
        })?;
    let rewritten =
        crate::openai::response_id::replace_values(body, &["previous_response_id"], |v| {
            (v == id).then(|| issued.upstream.clone())
        })
        .ok_or_else(|| {
            ApiError::invalid(
                "previous_response_id",
                "`previous_response_id` must be a plain string",
            )
        })?;
    Ok((instance.to_owned(), rewritten.into()))
}
