//! Every fleet-wide background job, started in one place and stopped
//! together: active health checks, capacity probes, discovery, engine load
//! readings for routing and the fair queues, the replicas' shared state
//! (`cluster.sync_ms`), and the metrics recorder's upkeep. Each
//! reads the current runtime every round, so a reload takes effect at once.
//!
//! Jobs that belong to one object end with it rather than here: a KV-event
//! subscriber with its feed, a JWKS refresh with its key set, the cluster
//! heartbeat with its Redis connection, a warm-up with its instance.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::AppState;

/// The running jobs; dropping this stops them all.
#[derive(Debug)]
pub struct Tasks {
    _jobs: JoinSet<()>,
}

/// Start the jobs of a gateway serving `state`. They hold it weakly and also
/// end on their own once nothing else holds it.
pub fn start(state: &Arc<AppState>) -> Tasks {
    let mut set = JoinSet::new();
    set.spawn(super::health::run(Arc::downgrade(state)));
    set.spawn(super::capacity::run(Arc::downgrade(state)));
    set.spawn(super::discovery::run(Arc::downgrade(state)));
    set.spawn(super::queue::engine_poll::run(Arc::downgrade(state)));
    set.spawn(super::peers::sync::run(Arc::downgrade(state)));
    set.spawn(crate::telemetry::upkeep());
    Tasks { _jobs: set }
}

/// Shutdown has begun: requests waiting in a fair queue are refused (503);
/// those already forwarded get the grace period.
pub fn shutting_down(state: &AppState) {
    for ep in &state.runtime.load().endpoints {
        ep.queue.close();
    }
}
