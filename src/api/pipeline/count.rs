//! Counting: every answer on an inference route is one `kvgate_requests_total`
//! sample, refusals included (401 before the body is read, 413, 415, 403, 429),
//! and so is a request whose client left before its answer began
//! (`status="cancelled"`, with its duration). The endpoint label is the one
//! the path names (native routes) or the analysis resolved from the body,
//! empty for a request refused before that.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

use crate::fleet::{AppState, Runtime};
use crate::route::Route;
use crate::telemetry::{self, EndpointSeries};

/// The endpoint a request resolved to, filled once it is known; shared with
/// the Responses API's by-id handler, which resolves it from the id.
#[derive(Clone, Default)]
pub struct EndpointSlot(Arc<OnceLock<Arc<EndpointSeries>>>);

impl EndpointSlot {
    pub fn set(&self, endpoint: &Arc<EndpointSeries>) {
        let _ = self.0.set(Arc::clone(endpoint));
    }

    fn get(&self) -> Option<&EndpointSeries> {
        self.0.get().map(|s| &**s)
    }
}

/// One request being counted: as cancelled if dropped before its answer came.
pub struct Counted {
    slot: EndpointSlot,
    route: Route,
    started: Instant,
    answered: bool,
}

impl Counted {
    /// A native route names its endpoint in the path: known before anything
    /// is checked. Only a configured one becomes a label (labels stay bounded).
    pub fn begin(runtime: &Runtime, route: Route, params: &HashMap<String, String>) -> Self {
        let slot = EndpointSlot::default();
        if let Some(ep) = params.get("endpoint").and_then(|n| runtime.endpoint(n)) {
            slot.set(&ep.series);
        }
        Self {
            slot,
            route,
            started: Instant::now(),
            answered: false,
        }
    }

    pub fn endpoint(&self, series: &Arc<EndpointSeries>) {
        self.slot.set(series);
    }

    pub fn answered(&mut self, status: StatusCode) {
        self.answered = true;
        match self.slot.get() {
            Some(ep) => ep.done(self.route, status.as_u16()),
            None => telemetry::request_done("", self.route.label(), status.as_u16()),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if !self.answered {
            let (api, took) = (self.route.label(), self.started.elapsed());
            let endpoint = self.slot.get().map_or("", EndpointSeries::name);
            telemetry::request_cancelled(endpoint, api);
            match self.slot.get() {
                Some(ep) => ep.duration(self.route, took),
                None => telemetry::request_duration("", api, took),
            }
        }
    }
}

/// The same count as a layer, for the authenticated routes that are not
/// inference: the Responses API's by-id routes are counted (their handler
/// fills the [`EndpointSlot`]); model lists match no route and pass untouched.
pub async fn layer(
    State(state): State<Arc<AppState>>,
    matched: MatchedPath,
    params: Option<Path<HashMap<String, String>>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(route) = Route::of_template(matched.as_str()) else {
        return next.run(req).await;
    };
    let params = params.map(|Path(p)| p).unwrap_or_default();
    let mut counted = Counted::begin(&state.runtime.load(), route, &params);
    req.extensions_mut().insert(counted.slot.clone());
    let response = next.run(req).await;
    counted.answered(response.status());
    response
}
