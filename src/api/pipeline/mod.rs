//! The inference pipeline: every step a model request takes before it is
//! forwarded, in order, in one handler and on one runtime snapshot.
//!
//! ```text
//! Request ─auth─► Caller ─claim─► Claimed ─analyse─► Analysed ─admit─► Admitted ─► send
//!             (401, 403)      (429: slot)     (4xx: body, key)    (403, 429, salt)
//! ```
//!
//! Each step consumes the previous step's value and returns the next's, so a
//! request cannot reach the proxy unauthenticated, unkeyed or unadmitted: a
//! missing step is a compile error, not a 500 at run time. The whole run is
//! counted ([`count::Counted`]), refusals and clients that leave included.

mod admit;
mod analyse;
pub mod auth;
pub mod count;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::proxy::{self, Wire};
use crate::error::{ApiError, ErrorKind};
use crate::fleet::{AppState, Runtime};
use crate::request::RouteInput;
use crate::route::Route;
use crate::tenancy::{Held, Tenant};

/// An authenticated request: its tenant is known.
pub struct Caller {
    pub tenant: Tenant,
    pub request: Request,
}

/// The tenant's concurrency slot is held (until the response ends).
pub struct Claimed {
    tenant: Tenant,
    held: Held,
    request: Request,
}

/// Parsed, validated and keyed: the endpoint and the routing key are known.
pub struct Analysed {
    tenant: Tenant,
    held: Held,
    parts: Parts,
    input: RouteInput,
    /// A streamed upload, forwarded as it arrives (`input.body` is empty).
    upload: Option<Body>,
}

/// Within the tenant's quotas, with the upstream cache salt set: ready to send.
pub struct Admitted {
    pub tenant: Tenant,
    pub parts: Parts,
    pub input: RouteInput,
    pub upload: Option<Body>,
    /// `x-ratelimit-*`, added to the answer.
    pub rate_headers: crate::tenancy::quota::RateHeaders,
}

impl Caller {
    /// Take one of the tenant's `max_concurrency` slots, before the body is
    /// read: slow uploads count against the tenant's own limit.
    async fn claim(self, runtime: &Runtime) -> Result<Claimed, ApiError> {
        let held = runtime.tenancy.hold(&self.tenant).await?;
        Ok(Claimed {
            tenant: self.tenant,
            held,
            request: self.request,
        })
    }
}

/// The handler of every inference route (`route::PATHS`).
pub async fn infer(
    State(state): State<Arc<AppState>>,
    matched: MatchedPath,
    params: Option<Path<HashMap<String, String>>>,
    request: Request,
) -> Response {
    let template = matched.as_str();
    let Some(route) = Route::of_template(template) else {
        return ApiError::new(ErrorKind::Internal, format!("no API for route {template}"))
            .into_response();
    };
    let runtime = state.runtime.load_full();
    let params = params.map(|Path(p)| p).unwrap_or_default();
    let mut counted = count::Counted::begin(&runtime, route, &params);
    let wire = Wire::of_template(template);
    let response = match steps(&runtime, route, template, &params, request, &mut counted).await {
        Ok(admitted) => send(&runtime, admitted, wire).await,
        Err(e) => e.into_response(),
    };
    counted.answered(response.status());
    response
}

async fn steps(
    runtime: &Arc<Runtime>,
    route: Route,
    template: &str,
    params: &HashMap<String, String>,
    request: Request,
    counted: &mut count::Counted,
) -> Result<Admitted, ApiError> {
    let caller = auth::authenticate(runtime, request).await?;
    let claimed = caller.claim(runtime).await?;
    let analysed = analyse::analyse(runtime, claimed, route, template, params).await?;
    counted.endpoint(&analysed.input.endpoint.series);
    admit::admit(runtime, analysed).await
}

/// Send an admitted request: wait for room in the endpoint's fair queue
/// where it has one, then forward it.
async fn send(runtime: &Runtime, admitted: Admitted, wire: Wire) -> Response {
    let Admitted {
        tenant,
        parts,
        input,
        upload,
        rate_headers,
    } = admitted;
    let path = match parts.uri.query() {
        Some(q) => format!("{}?{q}", input.route.upstream_path()),
        None => input.route.upstream_path().to_owned(),
    };
    let headers = &parts.headers;
    // Held until the request has its instance's slot: see `fleet::queue`.
    let mut resp = match proxy::wait_for_room(runtime, &input, headers, &tenant.id).await {
        Ok(reservation) => {
            let until_claimed =
                reservation.map(|r| Box::new(r) as Box<dyn std::fmt::Debug + Send + Sync>);
            let target = (path.as_str(), axum::http::Method::POST);
            let (headers, id) = ((headers, until_claimed), &tenant.id);
            proxy::forward_logged(runtime, input, target, headers, upload, id, wire).await
        }
        Err(e) => {
            // Refused before any engine saw it: no tokens to charge.
            if let Some(a) = &input.admission {
                a.settle(Some(0), 0);
            }
            // The fair queue's refusals (full, or waited too long).
            if matches!(e.status().as_u16(), 429 | 503) {
                let why = crate::telemetry::live::Refusal::Queue;
                runtime.tenancy.refused(&tenant.id, why);
            }
            e.into_response()
        }
    };
    // Every admitted request's answer says where the tenant stands.
    resp.headers_mut().extend(rate_headers);
    resp
}
