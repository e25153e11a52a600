//! Counting: every answer on an inference route is one `kvgate_requests_total`
//! sample, refusals included (401 before the body is read, 413, 415, 403, 429),
//! and so is a request whose client left before its answer began
//! (`status="cancelled"`, with its duration). The endpoint label is the one
//! the path names (native routes) or canonicalise resolved from the body,
//! empty for a request refused before that.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::fleet::AppState;
use crate::telemetry;

/// Filled by canonicalise with the endpoint it resolved.
#[derive(Clone, Default)]
pub struct EndpointSlot(Arc<OnceLock<String>>);

impl EndpointSlot {
    pub fn set(&self, endpoint: &str) {
        let _ = self.0.set(endpoint.to_owned());
    }

    fn get(&self) -> &str {
        self.0.get().map_or("", String::as_str)
    }
}

/// Counts the request as cancelled if dropped before its answer came.
struct Pending {
    slot: EndpointSlot,
    api: &'static str,
    started: Instant,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            let endpoint = self.slot.get();
            telemetry::request_cancelled(endpoint, self.api);
            telemetry::request_duration(endpoint, self.api, self.started.elapsed());
        }
    }
}

pub async fn count(
    State(state): State<Arc<AppState>>,
    matched: MatchedPath,
    params: Option<Path<HashMap<String, String>>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(api) = crate::route::Route::of_template(matched.as_str()).map(|r| r.label()) else {
        return next.run(req).await;
    };
    let slot = EndpointSlot::default();
    // A native route names its endpoint in the path: known before anything is
    // checked. Only a configured one becomes a label (labels stay bounded).
    if let Some(Path(p)) = params
        && let Some(name) = p.get("endpoint")
        && state.runtime.load().endpoint(name).is_some()
    {
        slot.set(name);
    }
    req.extensions_mut().insert(slot.clone());
    let mut pending = Pending {
        slot,
        api,
        started: Instant::now(),
        answered: false,
    };
    let response = next.run(req).await;
    pending.answered = true;
    telemetry::request_done(pending.slot.get(), api, response.status().as_u16());
    response
}
