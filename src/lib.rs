//! kvgate: an OpenAI-, Anthropic- and SageMaker-compatible gateway that
//! sends each request to the model server most likely to hold its prompt
//! prefix in KV cache.
//!
//! One chat request's way, and the module that handles each step:
//!
//! ```text
//!  socket ─► server ─────────► api ──────────────────────────────────────────► upstream ─────────► engine
//!            accept, guard:     front checks, route table (route::PATHS),       forward: plan,
//!            framing, timeouts  pipeline: auth → claim → analyse → admit,       dispatch, attempt,
//!                               fair queue (fleet::queue)                       failover, relay
//!                                              │                                   │
//!                                  request: bytes → RouteInput            fleet: Endpoint::view → loads,
//!                                  (endpoint, key, block chain, tokens)   kvgate_routing: policy → plan
//!  client ◄──────────────────────────────── upstream::respond: streamed body, usage, tenant settled
//! ```
//!
//! Modules, top first; each imports only from those below it (checked by
//! `scripts/layers.py`, which `.ci/run` runs):
//!
//! | module | role |
//! |---|---|
//! | [`demo`] | the embedded demo fleet behind `kvgate demo` |
//! | [`api`] | the HTTP surface: route table, layer stack, the typed inference pipeline, handlers |
//! | [`console`] | the live console (`/console`): page, login, snapshot, SSE, decision explain |
//! | [`server`] | accept loop, connection workers, the connection guard (framing, timeouts) |
//! | [`upstream`] | one routed request: forward, dispatch, attempt, the answer's relay and usage |
//! | [`request`] | a request's bytes → the [`request::RouteInput`] a policy sees; `explain` |
//! | [`fleet`] | runtime state (endpoints, instances, policies), fair queues, the state replicas share (`peers`), and every background job |
//! | [`kv_events`] | vLLM's KV-cache events over ZeroMQ: what each engine holds |
//! | [`openai`], [`anthropic`], [`sagemaker`] | each API's wire: bodies, ids, error shapes, event streams |
//! | [`config`] | the YAML, validated |
//! | [`tenancy`] | tenants: credentials, quotas, salts, priorities, Redis-shared limits |
//! | [`error`] | the error every layer answers with, in OpenAI's shape by default |
//! | [`telemetry`] | Prometheus series and OpenTelemetry traces |
//! | [`route`] | what an inference route is: template, label, API, upstream path |
//!
//! The routing policies, cost model and block indexes are the `kvgate_routing`
//! crate (pure: no I/O, no clock but the caller's); the offline what-if
//! (`kvgate simulate`) is `kvgate_simulate`. Tests and `main` both enter
//! through [`serve`].

pub mod anthropic;
pub mod api;
pub mod config;
pub mod console;
pub mod demo;
pub mod error;
pub mod fleet;
pub mod kv_events;
pub mod openai;
pub mod request;
pub mod route;
pub mod sagemaker;
pub mod server;
pub mod telemetry;
pub mod tenancy;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use config::Config;
pub use fleet::{AppState, Runtime};

/// Build the shared state from a validated config.
pub fn build_state(config: Config) -> anyhow::Result<Arc<AppState>> {
    Ok(AppState::new(Runtime::build(config, None)?))
}

/// Serve on an already bound listener until `shutdown` resolves; then stop
/// accepting, mark not-ready, and let in-flight requests finish for up to the
/// configured grace period. Request heads are read under a timeout
/// (`server/mod.rs` says why this is not `axum::serve`).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = api::router(Arc::clone(&state));
    let tasks = fleet::tasks::start(&state);
    let closing = Arc::clone(&state);
    let shutdown = async move {
        shutdown.await;
        fleet::tasks::shutting_down(&closing);
    };
    let served = server::run(listener, app, state, shutdown).await;
    drop(tasks);
    served
}
