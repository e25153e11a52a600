//! Several gateway replicas sharing tenant limits through one Redis
//! (`cluster.redis`).
//!
//! [`Cluster`] owns the connection (redis's auto-reconnecting
//! `ConnectionManager`), whether Redis is reachable, and a heartbeat task
//! that registers this replica, counts the live ones, renews the leases of
//! the concurrency slots this replica holds, and notices Redis coming back.
//! [`limits`] holds the three shared limits; the Lua that keeps them atomic
//! is in [`scripts`]. Tenancy asks here first and, when this returns
//! nothing (Redis unreachable or too slow), falls back to its local
//! limiters sized at [`Cluster::share`] of each limit.
//!
//! Every call on the request path is bounded by `cluster.timeout_ms`; while
//! Redis is known to be down the request path does not call it at all (the
//! heartbeat probes), so an outage costs requests nothing.

pub mod limits;
mod scripts;
pub mod settings;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub use limits::{Charged, ClusterSlot, Refused};
pub use settings::{ClusterConfig, RawCluster};

use crate::telemetry;

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// This replica's handle on the shared Redis.
pub struct Cluster {
    pub config: ClusterConfig,
    conn: ConnectionManager,
    state: AtomicU8,
    /// Live replicas Redis counted at the last heartbeat; 0 until then.
    replicas: AtomicU32,
    /// This process's id in the replica set.
    replica_id: String,
    /// Slots this replica holds: handle → (slot set key, slot id).
    held: Mutex<HashMap<u64, (String, String)>>,
    next_handle: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("up", &self.is_up())
            .field("replicas", &self.replicas.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connect (lazily: nothing waits for Redis here) and start the
    /// heartbeat. `None` outside a tokio runtime (`kvgate explain`), where
    /// nothing is served, or when the connection cannot even be set up.
    pub fn start(config: &ClusterConfig) -> Option<Arc<Self>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let info = settings::connection_info(&config.redis, config.password.as_ref()).ok()?;
        let client = redis::Client::open(info)
            .map_err(|e| tracing::error!(error = ?e.kind(), "cluster.redis: cannot set up a client; limits stay local"))
            .ok()?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout))
            // Reconnection is retried by the heartbeat; a request never waits for it.
            .set_number_of_retries(1)
            .set_max_delay(config.heartbeat);
        let conn = ConnectionManager::new_lazy_with_config(client, manager)
            .map_err(|e| tracing::error!(error = ?e.kind(), "cluster.redis: cannot set up a connection; limits stay local"))
            .ok()?;
        let cluster = Arc::new(Self {
            config: config.clone(),
            conn,
            state: AtomicU8::new(UNKNOWN),
            replicas: AtomicU32::new(0),
            replica_id: uuid::Uuid::new_v4().to_string(),
            held: Mutex::default(),
            next_handle: AtomicU64::new(0),
        });
        handle.spawn(heartbeat(Arc::downgrade(&cluster)));
        Some(cluster)
    }

    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Acquire) == UP
    }

    /// The divisor of each limit while Redis is away: the replicas Redis
    /// last counted, or `cluster.replicas` if it never has.
    pub fn share(&self) -> u32 {
        match self.replicas.load(Ordering::Relaxed) {
            0 => self.config.replicas,
            n => n,
        }
    }

    /// This process's id in the replica set (a UUID made at start).
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    /// A key under `cluster.key_prefix`.
    pub fn prefixed(&self, what: &str) -> String {
        format!("{}{what}", self.config.key_prefix)
    }

    /// Run `pipe` (the routing and fair-queue sync of `fleet::peers`), one
    /// reply a command; `None` when Redis is known to be down, fails, or
    /// takes longer than `timeout_ms`. Off the request path.
    pub async fn pipeline(&self, pipe: &redis::Pipeline) -> Option<Vec<redis::Value>> {
        if self.state.load(Ordering::Acquire) == DOWN {
            return None;
        }
        let mut conn = self.conn.clone();
        self.bounded(pipe.query_async(&mut conn)).await
    }

    fn key(&self, tenant: &str, what: &str) -> String {
        format!("{}{what}:{tenant}", self.config.key_prefix)
    }

    /// Run a script on the request path: `None` when Redis is known to be
    /// down, fails, or takes longer than `timeout_ms`.
    async fn call<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Option<T> {
        if self.state.load(Ordering::Acquire) == DOWN {
            return None;
        }
        self.call_anyway(invocation).await
    }

    async fn call_anyway<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Option<T> {
        let mut conn = self.conn.clone();
        self.bounded(invocation.invoke_async(&mut conn)).await
    }

    /// `call`'s answer within `timeout_ms`; a failure or a timeout marks Redis down.
    async fn bounded<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Option<T> {
        match tokio::time::timeout(self.config.timeout, call).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.went_down(&e.to_string());
                None
            }
            Err(_) => {
                self.went_down(&format!("no answer within {:?}", self.config.timeout));
                None
            }
        }
    }

    /// Log once per outage, not once per request.
    fn went_down(&self, why: &str) {
        // Gauges are set every time: the first heartbeat may run before
        // the metrics recorder is installed.
        metrics::gauge!(telemetry::CLUSTER_REDIS_UP).set(0.0);
        if self.state.swap(DOWN, Ordering::AcqRel) != DOWN {
            tracing::warn!(
                error = %why,
                share = self.share(),
                "cluster: Redis unreachable; serving on local limits (each limit / share) until it is back"
            );
        }
    }

    fn came_up(&self, replicas: u32) {
        self.replicas.store(replicas.max(1), Ordering::Relaxed);
        metrics::gauge!(telemetry::CLUSTER_REPLICAS).set(f64::from(replicas));
        metrics::gauge!(telemetry::CLUSTER_REDIS_UP).set(1.0);
        if self.state.swap(UP, Ordering::AcqRel) != UP {
            tracing::info!(
                replicas,
                "cluster: Redis reachable; tenant limits are shared"
            );
        }
    }

    /// One heartbeat: register this replica, renew held slots, count replicas.
    async fn beat(&self) {
        let slots: Vec<(String, String)> = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        // Generous: a late heartbeat must not make a live replica vanish
        // (the count only sizes the shares used while Redis is away).
        let ttl = self.config.heartbeat * 5;
        let mut inv = scripts::HEARTBEAT.prepare_invoke();
        inv.key(format!("{}replicas", self.config.key_prefix))
            .arg(&self.replica_id)
            .arg(ttl.as_millis() as u64)
            .arg(self.config.slot_lease.as_millis() as u64);
        for (key, _) in &slots {
            inv.key(key);
        }
        for (_, id) in &slots {
            inv.arg(id);
        }
        if let Some(n) = self.call_anyway::<u32>(&inv).await {
            self.came_up(n);
        }
    }
}

/// Every `heartbeat_ms` until the cluster is dropped (a reload that changes
/// `cluster`, or shutdown).
async fn heartbeat(cluster: Weak<Cluster>) {
    let every = match cluster.upgrade() {
        Some(c) => c.config.heartbeat,
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(c) = cluster.upgrade() else { return };
        c.beat().await;
    }
}
