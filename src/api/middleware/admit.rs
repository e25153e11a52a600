//! Admission, after the body is parsed and keyed: the tenant's model
//! allow-list (403) and quotas (429), the upstream cache salt, and the
//! admission ticket the response body holds until it ends. Admitted responses
//! carry `x-ratelimit-*` headers. The work is in [`crate::tenancy::Tenancy::admit`].

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorKind};
use crate::fleet::Runtime;
use crate::request::RouteInput;
use crate::tenancy::{Ask, Held, Tenant};

pub async fn admit(mut req: Request, next: Next) -> Response {
    // Use the runtime canonicalise loaded, so one request sees one config.
    let runtime = req.extensions().get::<Arc<Runtime>>().cloned();
    let tenant = req
        .extensions()
        .get::<Tenant>()
        .cloned()
        .unwrap_or_else(Tenant::anonymous);
    let req_held = req.extensions().get::<Held>().cloned();
    let (Some(runtime), Some(input)) = (runtime, req.extensions_mut().get_mut::<RouteInput>())
    else {
        return ApiError::new(ErrorKind::Internal, "admission ran before canonicalise")
            .into_response();
    };
    let ask = Ask {
        api: input.api,
        model: input.model.as_deref(),
        endpoint_models: &input.endpoint.config.models,
        body: &input.body,
        has_cache_salt: input.has_cache_salt,
        is_object: input.is_object,
    };
    let held = req_held.as_ref();
    match runtime.tenancy.admit(&tenant, ask, held).await {
        Ok(admitted) => {
            if let Some(body) = admitted.body {
                input.body = body;
            }
            input.admission = Some(Arc::new(admitted.admission));
            let mut resp = next.run(req).await;
            resp.headers_mut().extend(admitted.headers);
            resp
        }
        Err(e) => e.into_response(),
    }
}
