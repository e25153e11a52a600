//! The accept loop: at most `server.max_connections` client connections at
//! once, each served by [`crate::server::conn::serve`] (timeouts, framing checks,
//! lingering close), and graceful shutdown.
//!
//! Why not `axum::serve`: it gives hyper no timer (so no header timeout), no
//! cap on connections and no per-connection guard; see `conn/`.
//!
//! At the cap the loop stops accepting until a connection closes: new ones
//! wait in the kernel's listen backlog and are served in turn (clients see a
//! slow connect, not a reset), and nothing of the gateway's is spent on them.
//! The idle and header timeouts are what guarantee that slots come free.
//!
//! Each accepted connection is served on the least busy connection worker
//! ([`cores`]: a one-thread runtime a CPU, `server.workers`).
//!
//! Shutdown: stop accepting, mark not-ready, ask each connection to finish its
//! in-flight requests and close, and after `server.shutdown_grace_ms` close
//! whatever is left.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::fleet::AppState;

pub mod conn;
mod cores;

pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Read once: a reload changes neither the listener nor its timeouts.
    let config = Arc::clone(&state.runtime.load().config);
    let s = &config.server;
    let cores = cores::Cores::start(s.workers)?;
    let (limits, grace, max_connections) =
        (conn::Limits::of(s), s.shutdown_grace, s.max_connections);
    let builder = Arc::new(conn::builder(s, cores.streams()));
    let slots = Arc::new(Semaphore::new(max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            // Reap finished connections so the set stays the size of the live ones.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = accept(&listener, &slots) => match accepted {
                Ok((stream, slot)) => {
                    let _ = stream.set_nodelay(true);
                    // Registered with this runtime's reactor: move it to the worker's.
                    let Ok(stream) = stream.into_std() else { continue };
                    let (builder, app, stop) = (Arc::clone(&builder), app.clone(), stop_rx.clone());
                    let (worker, live) = cores.pick();
                    let serve = async move {
                        if let Ok(stream) = tokio::net::TcpStream::from_std(stream) {
                            conn::serve(stream, builder, app, stop, limits).await;
                        }
                        drop((slot, live));
                    };
                    conns.spawn_on(serve, worker);
                }
                Err(e) => accept_error(e).await,
            },
        }
    }
    state.shutting_down.store(true, Ordering::Relaxed);
    tracing::info!("shutting down: no new connections; waiting for in-flight requests");
    drop(listener);
    let _ = stop_tx.send(true);
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            ?grace,
            open = conns.len(),
            "grace period over; closing remaining connections"
        );
        conns.abort_all();
    }
    Ok(())
}

/// A connection slot, then a connection: at the cap, nothing is accepted.
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    let slot = Arc::clone(slots)
        .acquire_owned()
        .await
        .map_err(std::io::Error::other)?;
    let (stream, _) = listener.accept().await?;
    Ok((stream, slot))
}

/// Per-connection errors are the peer's business; others (out of file
/// descriptors) would spin the loop, so back off for a moment.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
