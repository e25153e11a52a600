//! The three shared limits of one tenant, as the request path sees them.
//! Each call answers `None` when Redis cannot decide in time; the caller
//! then decides on its local share.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Cluster, scripts};
use crate::telemetry;

/// A limit Redis refused, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The tenant's concurrency is used up across the replicas.
    Concurrency,
    Tokens(Duration),
    Requests(Duration),
}

/// What an admitted charge left, for the `x-ratelimit-remaining-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    pub tokens_left: Option<u64>,
    pub requests_left: Option<u64>,
}

/// A concurrency slot in the shared set, released when dropped. While held,
/// the heartbeat renews its lease; if this replica dies, the lease runs out.
#[derive(Debug)]
pub struct ClusterSlot {
    cluster: Arc<Cluster>,
    handle: u64,
}

impl Drop for ClusterSlot {
    fn drop(&mut self) {
        let held = self
            .cluster
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.handle);
        let Some((key, id)) = held else { return };
        // Release off the response's path; if Redis is away the lease expires.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let cluster = Arc::clone(&self.cluster);
            rt.spawn(async move {
                let release = redis::cmd("ZREM").arg(&key).arg(&id).clone();
                let mut conn = cluster.conn.clone();
                let sent = release.query_async::<i64>(&mut conn);
                if !matches!(
                    tokio::time::timeout(cluster.config.timeout, sent).await,
                    Ok(Ok(_))
                ) {
                    tracing::debug!("cluster: a slot release failed; its lease will expire");
                }
            });
        }
    }
}

impl Cluster {
    /// Claim one of `max` shared concurrency slots of `tenant`.
    pub async fn claim_slot(
        self: &Arc<Self>,
        tenant: &str,
        max: u32,
    ) -> Option<Result<ClusterSlot, Refused>> {
        let key = self.key(tenant, "slots");
        let id = format!("{}:{}", self.replica_id, uuid::Uuid::new_v4().simple());
        let lease = self.config.slot_lease.as_millis() as u64;
        let mut inv = scripts::CLAIM_SLOT.prepare_invoke();
        inv.key(&key).arg(max).arg(lease).arg(&id);
        let (claimed, _held): (i64, i64) = self.call(&inv).await?;
        if claimed != 1 {
            return Some(Err(Refused::Concurrency));
        }
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, (key, id));
        Some(Ok(ClusterSlot {
            cluster: Arc::clone(self),
            handle,
        }))
    }

    /// Charge `estimate` tokens against `tpm` and one request against
    /// `rpm`, atomically: a refusal of either charges neither.
    pub async fn charge(
        &self,
        tenant: &str,
        tpm: Option<u64>,
        estimate: u64,
        rpm: Option<u32>,
    ) -> Option<Result<Charged, Refused>> {
        let mut inv = scripts::CHARGE.prepare_invoke();
        inv.key(self.key(tenant, "tpm"))
            .key(self.key(tenant, "rpm"))
            .arg(tpm.unwrap_or(0))
            .arg(estimate)
            .arg(rpm.unwrap_or(0));
        let answer: Vec<i64> = self.call(&inv).await?;
        let at = |i: usize| answer.get(i).copied().unwrap_or(0);
        let wait = || Duration::from_millis(at(1).max(1) as u64);
        let left = |v: i64| u64::try_from(v).ok();
        Some(match at(0) {
            1 => Ok(Charged {
                tokens_left: left(at(1)),
                requests_left: left(at(2)),
            }),
            2 => Err(Refused::Tokens(wait())),
            3 => Err(Refused::Requests(wait())),
            _ => return None,
        })
    }

    /// Replace a charge of `charged` tokens with `actual`, off the request
    /// path (spawned; a failure leaves the estimate charged).
    pub fn settle(self: &Arc<Self>, tenant: &str, tpm: u64, charged: u64, actual: u64) {
        if charged == actual {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cluster = Arc::clone(self);
        let key = self.key(tenant, "tpm");
        let refund = charged as i64 - actual as i64;
        rt.spawn(async move {
            let mut inv = scripts::SETTLE.prepare_invoke();
            inv.key(&key).arg(tpm).arg(refund);
            if cluster.call::<i64>(&inv).await.is_none() {
                metrics::counter!(telemetry::CLUSTER_FALLBACK, "limit" => "settle").increment(1);
            }
        });
    }
}
