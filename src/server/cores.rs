//! The connection workers: one thread a CPU, each a tokio runtime of one
//! worker thread that serves the client connections the accept loop hands
//! it, with its own upstream connection pool
//! ([`crate::fleet::client::Proxies`]).
//!
//! Why not the multi-threaded runtime the rest of the gateway runs on: there a
//! request's client connection, its upstream connection and the idle second
//! worker that tokio wakes to steal work sit on different threads, and the
//! wake-ups cost a proxied request 4.2 context switches against nginx's 2.0
//! (bench/results/proxy-profile.md). Here an HTTP/1 connection, the tasks it
//! spawns and the upstream connections it uses stay on one thread, as an
//! nginx worker's do; an HTTP/2 connection's streams are dealt out to the
//! workers in turn (`conn/streams.rs`), so one multiplexed connection from a
//! proxy in front does not load one thread only. Health checks, discovery and
//! the other background tasks stay on the main runtime. The workers log
//! through the process's global subscriber (`main` installs it).
//!
//! A one-worker multi-threaded runtime rather than a current-thread one: the
//! same wake-ups, but with 10,000 open streams the current-thread scheduler
//! held 470–540 MiB against 300 (`cargo bench --bench overhead -- --memory`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;

/// The workers; dropping this stops them (their connections are dropped).
pub struct Cores {
    first: Worker,
    rest: Vec<Worker>,
}

struct Worker {
    handle: Handle,
    /// Taken only when dropped.
    rt: Option<tokio::runtime::Runtime>,
    /// Connections on it now.
    live: Arc<AtomicUsize>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Not a plain drop: this may run on an async thread, where that panics.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Counts a connection on its worker until dropped.
pub struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Cores {
    /// Start `n` workers (at least one), named `kvgate-worker-{i}`.
    pub fn start(n: usize) -> std::io::Result<Self> {
        let mut rest = Vec::with_capacity(n.saturating_sub(1));
        let first = Self::worker(0)?;
        for i in 1..n {
            rest.push(Self::worker(i)?);
        }
        Ok(Self { first, rest })
    }

    fn worker(i: usize) -> std::io::Result<Worker> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("kvgate-worker-{i}"))
            .on_thread_start(move || {
                crate::fleet::client::set_worker(i);
            })
            .enable_all()
            .build()?;
        Ok(Worker {
            handle: rt.handle().clone(),
            rt: Some(rt),
            live: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// An executor spreading HTTP/2 streams over the workers.
    pub fn streams(&self) -> crate::server::conn::StreamExecutor {
        let all = std::iter::once(&self.first).chain(&self.rest);
        crate::server::conn::StreamExecutor::new(all.map(|w| w.handle.clone()).collect())
    }

    /// The worker with the fewest connections, and the count of one more on
    /// it: long-lived streams spread evenly, not by turns.
    pub fn pick(&self) -> (&Handle, Live) {
        let load = |w: &Worker| w.live.load(Ordering::Relaxed);
        let w = self.rest.iter().fold(
            &self.first,
            |best, w| {
                if load(w) < load(best) { w } else { best }
            },
        );
        w.live.fetch_add(1, Ordering::Relaxed);
        (&w.handle, Live(Arc::clone(&w.live)))
    }
}
