//! The closed loop: a fixed number of clients, each sending its next request
//! as soon as its last one answers, over the same fixed workload as the open
//! loop, so throughput (requests per simulated second, first send to last
//! answer) is the wall time of the same work.
//!
//! The design, for session workloads: a client is a user (or an agent). It
//! takes the next unstarted session, in the workload's start order, and plays
//! it to its end — each turn sent when the previous one answers, sub-agents
//! inline where they branch, as a blocking `Task` call runs them — then takes
//! the next session. Think and tool times are dropped (the client moves
//! straight on); start times are ignored. So at most `clients` requests are in
//! flight, and fewer once fewer sessions are left than clients (a workload of
//! 8 agent sessions never has more than 8). A turn never jumps ahead of its
//! conversation's previous answer, and a client never interleaves two
//! conversations, which would turn one user's prefix reuse into another's
//! evictions. Single-request workloads (documents, traces) are sessions of
//! one turn, so there each client simply sends request after request.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::driver::{Record, Target, play};
use crate::workload::Session;

/// Play `sessions` with `clients` closed-loop clients; records in no order.
pub async fn drive(target: &Target, sessions: &[Session], clients: usize) -> Vec<Record> {
    let t0 = Instant::now();
    let target = Arc::new(target.clone());
    let sessions: Arc<[(usize, Session)]> = sessions.iter().cloned().enumerate().collect();
    let per = run_clients(clients, sessions, move |(id, session): (usize, Session)| {
        let target = Arc::clone(&target);
        async move { play(&target, id, &session, t0, false).await }
    })
    .await;
    let mut records = Vec::new();
    for (client, sessions) in per.into_iter().enumerate() {
        for mut r in sessions.into_iter().flatten() {
            r.chain = client;
            records.push(r);
        }
    }
    records
}

/// `clients` workers, each taking the next item in order and awaiting
/// `play` on it before taking another; every item is played once. The
/// results of each worker, in its order.
pub async fn run_clients<T, F, Fut, R>(clients: usize, items: Arc<[T]>, play: F) -> Vec<Vec<R>>
where
    T: Clone + Send + Sync + 'static,
    F: Fn(T) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = R> + Send,
    R: Send + 'static,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..clients.max(1).min(items.len()) {
        let (next, items, play) = (Arc::clone(&next), Arc::clone(&items), play.clone());
        tasks.spawn(async move {
            let mut out = Vec::new();
            while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)).cloned() {
                out.push(play(item).await);
            }
            out
        });
    }
    let mut results = Vec::with_capacity(clients);
    while let Some(done) = tasks.join_next().await {
        if let Ok(r) = done {
            results.push(r);
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn never_more_than_n_in_flight_and_every_item_once() {
        for clients in [1, 4, 8, 32] {
            let in_flight = Arc::new(AtomicUsize::new(0));
            let most = Arc::new(AtomicUsize::new(0));
            let items: Arc<[u64]> = (0..20u64).collect::<Vec<_>>().into();
            let (f, m) = (Arc::clone(&in_flight), Arc::clone(&most));
            let done = run_clients(clients, items, move |i: u64| {
                let (f, m) = (Arc::clone(&f), Arc::clone(&m));
                async move {
                    let now = f.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1 + i % 3)).await;
                    f.fetch_sub(1, Ordering::SeqCst);
                    i
                }
            })
            .await;
            assert_eq!(done.len(), clients.min(20));
            let mut done: Vec<u64> = done.into_iter().flatten().collect();
            done.sort_unstable();
            assert_eq!(done, (0..20).collect::<Vec<_>>());
            // Up to n at once, and exactly n while items last.
            assert_eq!(most.load(Ordering::SeqCst), clients.min(20), "{clients}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_client_plays_items_in_order_one_at_a_time() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = Arc::clone(&log);
        let items: Arc<[u32]> = vec![3, 1, 2].into();
        run_clients(1, items, move |i: u32| {
            let l = Arc::clone(&l);
            async move {
                l.lock().unwrap().push(("start", i));
                tokio::time::sleep(Duration::from_millis(u64::from(i))).await;
                l.lock().unwrap().push(("end", i));
            }
        })
        .await;
        let log = log.lock().unwrap().clone();
        let order: Vec<(&str, u32)> = [3, 1, 2]
            .iter()
            .flat_map(|&i| [("start", i), ("end", i)])
            .collect();
        assert_eq!(log, order);
    }
}
