//! kvgate: an OpenAI- and SageMaker-compatible gateway that sends each request
//! to the model server most likely to hold its prompt prefix in KV cache.
//!
//! ```text
//! client ─► conn guard ─► request id ─► trace ─► auth ─► claim ─► canonicalise ─► admit ─► handler ─► policy ─► upstream ─► client
//!              │                                  │        │          │            │
//!      framing, timeouts                       Tenant  its slot   RouteInput   quotas, cache salt
//! ```
//!
//! The canonicalise layer parses the body once and computes the routing key
//! `xxh3(tenant ‖ 0 ‖ partition ‖ 0 ‖ window)`; the policy orders instances by
//! bounded-load consistent hashing; the upstream module claims an in-flight
//! slot, fails over while nothing has reached the client, and streams the
//! answer back. Tests and `main` both enter through [`serve`].

pub mod anthropic;
pub mod api;
pub mod config;
pub mod demo;
pub mod error;
pub mod fleet;
pub mod kv_events;
pub mod openai;
pub mod request;
pub mod route;
pub mod sagemaker;
pub mod server;
pub mod simulate;
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
    tokio::spawn(fleet::health::run(Arc::downgrade(&state)));
    tokio::spawn(fleet::capacity::run(Arc::downgrade(&state)));
    tokio::spawn(fleet::discovery::run(Arc::downgrade(&state)));
    tokio::spawn(fleet::queue::engine_poll::run(Arc::downgrade(&state)));
    tokio::spawn(telemetry::upkeep());
    // Requests waiting in a fair queue are refused (503) when shutdown
    // begins; those already forwarded get the grace period.
    let closing = Arc::clone(&state);
    let shutdown = async move {
        shutdown.await;
        for ep in &closing.runtime.load().endpoints {
            ep.queue.close();
        }
    };
    server::run(listener, app, state, shutdown).await
}
