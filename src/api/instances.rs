//! Admin routes over the running fleet: `GET /admin/instances` lists every
//! instance with its state, and `POST /admin/instances/drain` drains one (or
//! undrains it) without a reload: it takes no new requests while its
//! in-flight ones finish; poll `in_flight` until it reaches 0.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorKind};
use crate::fleet::AppState;
use crate::fleet::Instance;

fn describe(i: &Instance) -> Value {
    json!({
        "id": i.id,
        "url": i.url,
        "healthy": i.is_healthy(),
        "draining": i.is_draining(),
        "available": i.available(),
        "in_flight": i.in_flight(),
    })
}

/// `GET /admin/instances`: every endpoint's instances, as routing sees them now.
pub async fn list(State(state): State<Arc<AppState>>) -> Json<Value> {
    let rt = state.runtime.load();
    let endpoints: Vec<Value> = rt
        .endpoints
        .iter()
        .map(|e| {
            let instances: Vec<Value> = e.instances.iter().map(|i| describe(i)).collect();
            json!({"name": e.name(), "instances": instances})
        })
        .collect();
    Json(json!({"endpoints": endpoints}))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    endpoint: String,
    instance: String,
    /// `false` puts it back; default `true`.
    #[serde(default = "yes")]
    draining: bool,
}

fn yes() -> bool {
    true
}

/// `POST /admin/instances/drain` with `{"endpoint", "instance", "draining"?}`.
pub async fn drain(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    let req: Drain = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return ApiError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "expected {{\"endpoint\": …, \"instance\": …, \"draining\": true|false}}: {e}"
                ),
            )
            .into_response();
        }
    };
    let rt = state.runtime.load();
    let Some(ep) = rt.endpoint(&req.endpoint) else {
        return ApiError::new(
            ErrorKind::EndpointNotFound,
            format!("no endpoint named {:?}", req.endpoint),
        )
        .with_param("endpoint")
        .into_response();
    };
    let Some(inst) = ep.instances.iter().find(|i| i.id == req.instance) else {
        return ApiError::new(
            ErrorKind::InvalidRequest,
            format!(
                "endpoint {:?} has no instance {:?}",
                req.endpoint, req.instance
            ),
        )
        .with_param("instance")
        .into_response();
    };
    inst.set_draining(req.draining);
    Json(describe(inst)).into_response()
}
