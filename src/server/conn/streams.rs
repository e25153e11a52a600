//! Where an HTTP/2 connection's streams run: on the connection workers in
//! turn. A connection stays on the worker it was given, but a client that
//! multiplexes many requests over one HTTP/2 connection (a proxy in front
//! speaking HTTP/2 to the gateway) would otherwise be served by one thread.
//! HTTP/1 spawns nothing here: its requests run on the connection's task.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;

/// hyper's executor for HTTP/2 streams. With no workers (the fuzz target), the
/// current runtime.
#[derive(Debug, Clone, Default)]
pub struct StreamExecutor {
    workers: Arc<[Handle]>,
    next: Arc<AtomicUsize>,
}

impl StreamExecutor {
    pub fn new(workers: Vec<Handle>) -> Self {
        Self {
            workers: workers.into(),
            next: Arc::default(),
        }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        if self.workers.is_empty() {
            tokio::spawn(fut);
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        self.workers[i].spawn(fut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor as _;

    #[test]
    fn streams_go_to_the_workers_in_turn() {
        let rt = |name: &'static str| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(name)
                .enable_all()
                .build()
                .unwrap()
        };
        let (a, b) = (rt("worker-a"), rt("worker-b"));
        let exec = StreamExecutor::new(vec![a.handle().clone(), b.handle().clone()]);
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..4 {
            let tx = tx.clone();
            exec.execute(async move {
                let name = std::thread::current().name().map(str::to_owned);
                tx.send(name).unwrap();
            });
        }
        let mut names: Vec<_> = (0..4).map(|_| rx.recv().unwrap().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["worker-a", "worker-a", "worker-b", "worker-b"]);
    }
}
