//! Serving an instance on a socket: `spawn` binds (HTTP, and the KV-event sockets
//! when configured), serves in a task and returns a handle that shuts the listener
//! down when dropped.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::config::SimConfig;
use crate::kv_events::{self, Endpoints, Wire};
use crate::server::SimServer;

/// A running instance. Dropping it stops accepting connections; requests in flight
/// finish. [`SimHandle::shutdown`] also waits for them.
pub struct SimHandle {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state, for [`SimServer::stats`].
    pub server: Arc<SimServer>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
    kv: Option<Endpoints>,
}

impl SimHandle {
    /// `http://{addr}`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The KV-event PUB socket, `tcp://127.0.0.1:PORT`, when `kv_events` is set.
    pub fn kv_events_endpoint(&self) -> Option<String> {
        self.kv.as_ref().map(|kv| kv.events.clone())
    }

    /// The KV-event replay ROUTER socket, `tcp://127.0.0.1:PORT`, when `kv_events` is set.
    pub fn kv_replay_endpoint(&self) -> Option<String> {
        self.kv.as_ref().map(|kv| kv.replay.clone())
    }

    /// See [`SimServer::drop_kv_batches`].
    pub fn drop_kv_batches(&self, n: usize) {
        self.server.drop_kv_batches(n);
    }

    /// See [`SimServer::silence_kv_events`].
    pub fn silence_kv_events(&self, silent: bool) {
        self.server.silence_kv_events(silent);
    }

    /// See [`SimServer::restart_kv_publisher`].
    pub async fn restart_kv_publisher(&self) {
        self.server.restart_kv_publisher().await;
    }

    /// Stop accepting, wait for open connections to finish.
    pub async fn shutdown(mut self) -> io::Result<()> {
        self.stop.take().map(|stop| stop.send(()));
        match self.task.take() {
            Some(task) => task.await.map_err(io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.stop.take().map(|stop| stop.send(()));
    }
}

/// Bind `addr` (use `127.0.0.1:0` for an ephemeral port), serve `cfg`'s instance in a
/// tokio task and return its handle.
pub async fn spawn(cfg: SimConfig, addr: SocketAddr) -> io::Result<SimHandle> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let server = SimServer::new(cfg);
    let kv = match server.config().kv_events.as_ref() {
        Some(kv) => {
            let wire = Wire {
                encoding: kv.encoding,
                hashes: kv.hashes,
                block_size: server.config().block_size,
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let endpoints = kv_events::bind(kv, wire, rx).await?;
            server.attach_kv_publisher(tx);
            Some(endpoints)
        }
        None => None,
    };
    let app = server.router();
    // As vLLM's uvicorn does: without TCP_NODELAY a streamed answer's first
    // chunk, written right after the headers, waits ~40 ms for a delayed ACK.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(SimHandle {
        addr,
        server,
        stop: Some(stop),
        task: Some(task),
        kv,
    })
}

/// `n` instances of `cfg` named `{cfg.name}-0` … on ephemeral loopback ports.
pub async fn spawn_fleet(cfg: &SimConfig, n: usize) -> io::Result<Vec<SimHandle>> {
    let mut fleet = Vec::with_capacity(n);
    for i in 0..n {
        let cfg = SimConfig {
            name: format!("{}-{i}", cfg.name),
            ..cfg.clone()
        };
        fleet.push(spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await?);
    }
    Ok(fleet)
}
