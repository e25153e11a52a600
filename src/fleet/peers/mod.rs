//! Several gateway replicas routing as one (`cluster.sync_ms`): what only a
//! gateway knows — the requests each replica has in flight on each instance,
//! the prefill it queued there, the work it sent lately, the prompts
//! `longest_prefix` placed, each tenant's fair-queue service — shared through
//! the Redis the replicas already use for tenant limits.
//!
//! Every `sync_ms` each replica runs one pipeline ([`sync`]):
//! - `HSET peers <id> <its figures>` and `HGETALL peers`: every replica's
//!   per-instance figures and per-tenant service, stamped with Redis's clock.
//!   A replica's load then counts its own requests plus the others' as of
//!   their last round (at most `sync_ms` old); fair queues order tenants by
//!   the fleet's service. Entries older than [`STALE`] are ignored, so a dead
//!   replica's requests stop counting within a second.
//! - `XADD routed …` for each prompt it placed since the last round and
//!   `XREAD routed` from where it left off: the chains the others placed go
//!   into this replica's block index for their instance, so a conversation's
//!   next turn finds its holder whichever replica it reaches. The stream is
//!   capped at `routed_history` entries; a replica that starts reads it from
//!   the beginning before it trusts its index.
//!
//! What each strategy needs: `prefix_aware` nothing (the ring is the same
//! everywhere); `kv_aware` the load figures (the engines' events already give
//! every replica the same cache picture); `longest_prefix` the load figures
//! and the routed stream. Engine readings (`/metrics`) are the same truth for
//! every replica and are read by each ([`super::engine_load`]).
//!
//! When Redis is away each replica routes on its own view: the others'
//! figures are dropped after [`STALE`], the failure is logged once (by the
//! cluster) and counted, and the next round that succeeds converges again.

pub mod load;
pub mod sync;
mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use load::{Figures, PeerLoad};

use crate::tenancy::cluster::Cluster;

/// Other replicas' figures older than this are not believed.
pub const STALE: Duration = Duration::from_secs(1);
/// Placed prompts held for the next round at most; more are dropped (counted).
const OUTBOX_LIMIT: usize = 8192;

/// One prompt placed on an instance, to tell the other replicas.
#[derive(Debug, Clone)]
pub struct Routed {
    pub endpoint: String,
    pub instance: String,
    pub chain: Vec<u64>,
}

/// This replica's side of the sharing: the cluster it shares through and
/// the placements waiting for the next round.
#[derive(Debug)]
pub struct Peers {
    pub cluster: Arc<Cluster>,
    pub every: Duration,
    outbox: Mutex<Vec<Routed>>,
    /// Placements dropped because the outbox was full (Redis slow or away).
    pub dropped: AtomicU64,
}

impl Peers {
    /// Sharing through `cluster`, when its `sync_ms` turns it on.
    pub fn new(cluster: &Arc<Cluster>) -> Option<Arc<Self>> {
        let every = cluster.config.sync?;
        Some(Arc::new(Self {
            cluster: Arc::clone(cluster),
            every,
            outbox: Mutex::default(),
            dropped: AtomicU64::new(0),
        }))
    }

    /// A prompt was placed on `instance` (its answer has begun): tell the
    /// others at the next round. Never waits on Redis.
    pub fn routed(&self, endpoint: &str, instance: &str, chain: &[u64]) {
        if chain.is_empty() {
            return;
        }
        let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
        if out.len() >= OUTBOX_LIMIT {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        out.push(Routed {
            endpoint: endpoint.to_owned(),
            instance: instance.to_owned(),
            chain: chain.to_vec(),
        });
    }

    fn take_outbox(&self) -> Vec<Routed> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
