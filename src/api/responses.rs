//! `GET` / `DELETE /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`:
//! sent to the instance the id names (see [`crate::openai::response_id`]),
//! with the upstream's own id. An id this tenant was not issued is a 404, as
//! is one whose instance has left the endpoint. Answers carry kvgate's ids.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorKind};
use crate::fleet::AppState;
use crate::openai::response_id::IdScope;
use crate::request::RouteInput;
use crate::route::{Placement, Route};
use crate::tenancy::Tenant;

pub async fn by_id(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    tenant: Option<Extension<Tenant>>,
    slot: Option<Extension<crate::api::pipeline::count::EndpointSlot>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let slot = slot.map(|Extension(s)| s);
    let cancel = uri.path().ends_with("/cancel");
    let runtime = state.runtime.load_full();
    let tenant = tenant.map_or_else(Tenant::anonymous, |t| t.0);
    let scope = IdScope::new(runtime.config.tenancy.salt_secret.as_ref(), &tenant.id);
    let not_found = || {
        ApiError::new(
            ErrorKind::ResponseNotFound,
            format!("Response with id '{id}' not found."),
        )
        .into_response()
    };
    let Some(issued) = scope.decode(&id) else {
        return not_found();
    };
    // The endpoint whose instance the id names (tags are per endpoint).
    let Some((endpoint, instance)) = runtime.endpoints.iter().find_map(|ep| {
        let ids = ep.instances.iter().map(|i| i.id.as_str());
        scope
            .instance_of(&issued, ep.name(), ids)
            .map(|i| (ep, i.to_owned()))
    }) else {
        return not_found();
    };
    if let Some(slot) = slot {
        slot.set(&endpoint.series);
    }
    let mut path = format!("/v1/responses/{}", issued.upstream);
    if cancel {
        path.push_str("/cancel");
    }
    if let Some(q) = uri.query() {
        path = format!("{path}?{q}");
    }
    let input = RouteInput {
        ids: Some(scope),
        ..RouteInput::unkeyed(
            Route::ResponseById,
            Arc::clone(endpoint),
            Placement::Pinned(instance),
        )
    };
    super::proxy::forward_logged(
        &runtime,
        input,
        (&path, method),
        (&headers, None),
        None,
        &tenant.id,
        super::proxy::Wire::Plain,
    )
    .await
}
