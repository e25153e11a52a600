//! kvgate: an OpenAI- and SageMaker-compatible gateway that sends each request
//! to the model server most likely to hold its prompt prefix in KV cache.
//!
//! ```text
//! client ─► request id ─► trace ─► auth ─► canonicalise ─► handler ─► policy ─► upstream ─► client
//!                                   │          │
//!                                Tenant    RouteInput
//! ```
//!
//! The canonicalise layer parses the body once and computes the routing key
//! `xxh3(tenant ‖ 0 ‖ partition ‖ 0 ‖ window)`; the policy orders instances by
//! bounded-load consistent hashing; the upstream module claims an in-flight
//! slot, fails over while nothing has reached the client, and streams the
//! answer back. Tests and `main` both enter through [`serve`].

pub mod api;
pub mod config;
pub mod demo;
pub mod error;
pub mod explain;
pub mod middleware;
pub mod route_input;
pub mod routing;
pub mod state;
pub mod telemetry;
pub mod tenancy;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;

pub use config::Config;
pub use state::{AppState, Runtime};

/// Build the shared state from a validated config.
pub fn build_state(config: Config) -> anyhow::Result<Arc<AppState>> {
    Ok(AppState::new(Runtime::build(config, None)?))
}

/// Serve on an already bound listener until `shutdown` resolves; then stop
/// accepting, mark not-ready, and let in-flight requests finish for up to the
/// configured grace period.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = api::router(Arc::clone(&state));
    tokio::spawn(upstream::health::run(Arc::downgrade(&state)));
    let grace = state.runtime.load().config.server.shutdown_grace;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let flag = Arc::clone(&state);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        flag.shutting_down.store(true, Ordering::Relaxed);
        tracing::info!("shutting down: no new connections; waiting for in-flight requests");
        let _ = tx.send(());
    });
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        r = &mut server => r,
        _ = async {
            let _ = rx.await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(?grace, "grace period over; closing remaining connections");
            Ok(())
        }
    }
}
