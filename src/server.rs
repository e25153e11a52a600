//! The accept loop: hyper's HTTP/1 and HTTP/2 server with the timeouts that
//! `axum::serve` leaves off, and graceful shutdown.
//!
//! `axum::serve` gives hyper no timer, so hyper's header read timeout never
//! runs and a client sending its headers one byte a second (slowloris) holds a
//! connection and its task for ever. Here:
//!
//! - every HTTP/1 request head, first or keep-alive, must arrive within
//!   `server.timeouts.header_read_ms` (hyper answers 408 and closes);
//! - every connection must deliver its first request head within that time,
//!   whatever the protocol: this also bounds the protocol sniffing that
//!   happens before hyper sees a request, and a stalled HTTP/2 preface;
//! - heads larger than hyper's read buffer (about 400 KiB) get 431 and the
//!   connection is closed; conflicting `content-length`s get 400.
//!
//! Shutdown: stop accepting, mark not-ready, ask each connection to finish its
//! in-flight requests and close, and after `server.shutdown_grace_ms` close
//! whatever is left.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::state::AppState;

pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Read once: a reload changes neither the listener nor its timeouts.
    let (header_read, grace) = {
        let rt = state.runtime.load();
        let s = &rt.config.server;
        (s.timeouts.header_read, s.shutdown_grace)
    };
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            // Reap finished connections so the set stays the size of the live ones.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(connection(stream, Arc::clone(&builder), app.clone(), stop_rx.clone(), header_read));
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

async fn connection(
    stream: TcpStream,
    builder: Arc<Builder<TokioExecutor>>,
    app: Router,
    mut stop: watch::Receiver<bool>,
    header_read: Duration,
) {
    let _ = stream.set_nodelay(true);
    let started = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&started);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        seen.store(true, Ordering::Relaxed);
        app.clone().oneshot(req)
    });
    let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
    let mut first_deadline = pin!(tokio::time::sleep(header_read));
    let mut stopping = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // The guard is only read when select! starts, so check again: a
            // request may have begun while we waited.
            () = &mut first_deadline, if !started.load(Ordering::Relaxed) => {
                if !started.load(Ordering::Relaxed) {
                    tracing::debug!(?header_read, "no request head in time; closing the connection");
                    return;
                }
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
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
