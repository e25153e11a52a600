//! Open and informational routes: `/health`, `/ready`, `/metrics`, `/v1/models`,
//! and the admin-only `/admin/explain/…`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::json;

use crate::fleet::AppState;

/// Liveness: the process serves HTTP.
pub async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// Readiness: not shutting down, and every endpoint has a healthy instance
/// (with active health checks: one that has passed a probe).
pub async fn ready(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    if state.shutting_down.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        );
    }
    let rt = state.runtime.load();
    let down: Vec<&str> = rt
        .endpoints
        .iter()
        // With active checks, an instance counts once a probe has confirmed it.
        .filter(|e| {
            let probed = e.config.health.is_some();
            !e.instances
                .iter()
                .any(|i| i.is_healthy() && (!probed || i.confirmed()))
        })
        .map(|e| e.name())
        .collect();
    if down.is_empty() {
        (StatusCode::OK, Json(json!({"status": "ready"})))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unready", "endpoints_without_healthy_instances": down})),
        )
    }
}

/// The Prometheus text of the instances configured now (see [`super::metrics`]).
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let rt = state.runtime.load();
    let live = rt
        .endpoints
        .iter()
        .flat_map(|e| e.instances.iter().map(|i| (e.name(), i.id.as_str())))
        .collect();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        super::metrics::without_removed(&state.metrics.render(), &live),
    )
}

/// The configured models this tenant may use, in OpenAI's list shape.
pub async fn models(
    State(state): State<Arc<AppState>>,
    tenant: Option<axum::Extension<crate::tenancy::Tenant>>,
) -> impl IntoResponse {
    let rt = state.runtime.load();
    let tenant = tenant
        .map(|t| t.0)
        .unwrap_or_else(crate::tenancy::Tenant::anonymous);
    let data: Vec<_> = rt
        .models()
        .filter(|(id, _)| rt.tenancy.may_use(&tenant, id))
        .map(|(id, endpoint)| json!({"id": id, "object": "model", "created": 0, "owned_by": endpoint}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{model}`: one configured model this tenant may use (ids
/// may contain `/`), or a 404 in OpenAI's shape.
pub async fn model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    tenant: Option<axum::Extension<crate::tenancy::Tenant>>,
) -> axum::response::Response {
    let rt = state.runtime.load();
    let tenant = tenant
        .map(|t| t.0)
        .unwrap_or_else(crate::tenancy::Tenant::anonymous);
    match rt
        .models()
        .find(|(m, _)| *m == id && rt.tenancy.may_use(&tenant, m))
    {
        Some((m, endpoint)) => {
            Json(json!({"id": m, "object": "model", "created": 0, "owned_by": endpoint}))
                .into_response()
        }
        None => crate::error::ApiError::model_not_found(&id).into_response(),
    }
}

/// `?tenant=` on `/admin/explain/…`: whose request to explain.
#[derive(serde::Deserialize)]
pub struct ExplainAs {
    tenant: Option<String>,
}

/// `POST /admin/explain/{path}?tenant=ID`: how a request to `/{path}` from
/// that tenant (default: the anonymous one) would be routed now. Admin only.
pub async fn explain(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(path): axum::extract::Path<String>,
    axum::extract::Query(who): axum::extract::Query<ExplainAs>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> axum::response::Response {
    let rt = state.runtime.load_full();
    let result = async {
        let tenant = who.tenant.unwrap_or_else(|| "anonymous".to_owned());
        if !crate::tenancy::is_valid_tenant_id(&tenant) {
            return Err(crate::error::ApiError::new(
                crate::error::ErrorKind::InvalidRequest,
                "tenant must be 1-128 visible ASCII characters",
            )
            .with_param("tenant"));
        }
        let bytes = crate::api::middleware::body_limit::read_limited(
            &headers,
            body,
            rt.config.server.max_body_bytes,
            rt.config.server.timeouts.body_read,
        )
        .await?;
        crate::request::explain::explain(&rt, &format!("/{path}"), &headers, bytes, &tenant)
    }
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
