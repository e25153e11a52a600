//! The HTTP routes vLLM serves (OpenAI, Anthropic Messages and SageMaker), and
//! their handlers (the Messages ones in `messages/`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::error::ApiError;
use crate::request::{self, Parse};
use crate::response::{self, Usage};
use crate::server::SimServer;
use crate::{messages, metrics, sse};

/// Far above any prompt the KV cache could hold, but bounded.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

type Payload = Result<Bytes, BytesRejection>;

impl SimServer {
    /// Every route: `POST /v1/chat/completions`, `/v1/completions`, `/invocations`,
    /// `/v1/responses`, `/v1/embeddings`, `/v1/messages`,
    /// `/v1/messages/count_tokens`; `GET /v1/responses/{id}`;
    /// `GET /ping`, `/health`, `/v1/models`, `/metrics`. Unknown paths and
    /// methods get an OpenAI-shaped 404 or 405.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .route("/invocations", post(invocations))
            .route("/v1/responses", post(responses))
            .route("/v1/responses/{id}", get(retrieve))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/messages", post(messages::create))
            .route("/v1/messages/count_tokens", post(messages::count))
            .route("/ping", get(ok))
            .route("/health", get(ok))
            .route("/v1/models", get(models))
            .route("/metrics", get(prometheus))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .with_state(self.clone())
    }
}

async fn chat(State(s): State<Arc<SimServer>>, body: Payload) -> Response {
    generate(&s, body, request::parse_chat).await
}

async fn completions(State(s): State<Arc<SimServer>>, body: Payload) -> Response {
    generate(&s, body, request::parse_completion).await
}

async fn invocations(State(s): State<Arc<SimServer>>, body: Payload) -> Response {
    generate(&s, body, request::parse_invocation).await
}

async fn generate(s: &SimServer, body: Payload, parse: Parse) -> Response {
    match try_generate(s, body, parse).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn try_generate(s: &SimServer, body: Payload, parse: Parse) -> Result<Response, ApiError> {
    let job = parse(&body?, s.cfg.tokenizer.as_deref())?;
    let accepted = s.submit(&job)?;
    if job.stream {
        let response = sse::response(
            &accepted.meta,
            accepted.rx,
            accepted.prompt_tokens,
            job.include_usage,
        );
        return Ok(response);
    }
    // Dropping this future (client gone) drops `rx`, which aborts the sequence.
    let mut rx = accepted.rx;
    let p = *rx
        .wait_for(|p| p.done || p.rejected)
        .await
        .map_err(|_| ApiError::unavailable("the engine stopped"))?;
    if p.rejected {
        return Err(ApiError::bad_request(
            "the request does not fit this instance",
            None,
        ));
    }
    let usage = Usage {
        prompt_tokens: accepted.prompt_tokens,
        completion_tokens: p.generated,
        cached_tokens: p.cached_tokens,
    };
    Ok(Json(response::complete(&accepted.meta, usage)).into_response())
}

async fn responses(State(s): State<Arc<SimServer>>, body: Payload) -> Response {
    let result = match body {
        Ok(b) => s.respond(&b).await,
        Err(e) => Err(ApiError::from(e)),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn retrieve(
    State(s): State<Arc<SimServer>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    s.retrieve(&id).unwrap_or_else(IntoResponse::into_response)
}

async fn embeddings(body: Payload) -> Response {
    let result = match body {
        Ok(b) => crate::responses::embeddings(&b),
        Err(e) => Err(ApiError::from(e)),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn ok() -> &'static str {
    ""
}

async fn models(State(s): State<Arc<SimServer>>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.cfg.model,
        "object": "model",
        "created": 0,
        "owned_by": "kvgate-sim",
        "root": s.cfg.model,
        "parent": null,
        "max_model_len": s.cfg.cache_blocks * s.cfg.block_size,
    }]}))
}

async fn prometheus(State(s): State<Arc<SimServer>>) -> Response {
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], metrics::render(&s)).into_response()
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    let message = format!("{method} is not allowed on {}", uri.path());
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message)
}
