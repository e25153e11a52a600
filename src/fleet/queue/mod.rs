//! Fair queueing in the gateway (`queue.enabled`): when every instance of an
//! endpoint is saturated — at the gateway's own in-flight bound, or its
//! engine reporting waiting requests or a full KV cache — a request waits
//! here instead of in an engine's first-come-first-served queue, and is
//! released as capacity frees: highest priority first, then the tenant that
//! has received the least weighted service ([`order`]), FCFS within it.
//!
//! A released request is routed by the endpoint's strategy as usual. Waits
//! are bounded (`max_length`, `max_wait_ms`: then 429 with `retry-after`); a
//! client that leaves is taken out at once; shutdown refuses what waits;
//! the queue belongs to its endpoint and survives reloads.
//!
//! Each replica queues its own requests, but with replicas sharing their
//! state (`cluster.sync_ms`, see `fleet::peers`) every tenant's counter
//! holds the service the whole fleet gave it, as of the others' last round:
//! a tenant spread over R replicas is served as one, and the gap between
//! two backlogged tenants keeps the single gateway's bound plus what one
//! round (`sync_ms`) of the others' service adds.

pub mod engine_poll;
pub mod order;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::oneshot;

use crate::config::queue::QueueConfig;
use crate::error::{ApiError, ErrorKind};
use crate::fleet::Instance;
use crate::tenancy::priority::Priority;
use order::Order;

/// What a queued request needs to know about its place: its tenant, class
/// and weight, and the prompt tokens its release charges.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub tenant: &'a str,
    pub priority: Priority,
    pub weight: f64,
    pub prompt_tokens: u64,
}

/// One endpoint's queue; the endpoint's instances and the `queue` config are
/// swapped in by every (re)build.
#[derive(Debug)]
pub struct FairQueue {
    endpoint: String,
    me: Weak<FairQueue>,
    inner: Mutex<Inner>,
    /// Waiting requests, read without the lock on every request's end.
    waiting: AtomicUsize,
    fleet: ArcSwap<Fleet>,
}

#[derive(Debug, Default)]
struct Fleet {
    instances: Vec<Arc<Instance>>,
    config: QueueConfig,
}

/// A waiting request: how to wake it, and what its release charges.
#[derive(Debug)]
struct Waiting {
    tx: oneshot::Sender<Reservation>,
    prompt_tokens: u64,
    weight: f64,
}

#[derive(Debug, Default)]
struct Inner {
    order: Order<Waiting>,
    /// Released requests that have not yet taken an instance's slot.
    reserved: usize,
    closed: bool,
    /// The other replicas' service to each tenant at their last round.
    peer_service: std::collections::HashMap<String, f64>,
}

impl FairQueue {
    pub fn new(endpoint: &str) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            endpoint: endpoint.to_owned(),
            me: Weak::clone(me),
            inner: Mutex::default(),
            waiting: AtomicUsize::new(0),
            fleet: ArcSwap::default(),
        })
    }

    /// The endpoint's instances and config as of this build; whatever now
    /// has room is released.
    pub fn configure(&self, instances: Vec<Arc<Instance>>, config: QueueConfig) {
        let enabled = config.enabled;
        self.fleet.store(Arc::new(Fleet { instances, config }));
        if enabled {
            self.pump();
            return;
        }
        // Queueing turned off: whoever waits goes on, as new requests do.
        let mut inner = self.lock();
        let waiting = inner.order.drain();
        inner.reserved += waiting.len();
        drop(inner);
        self.waiting.store(0, Ordering::Relaxed);
        for w in waiting {
            if let Err(mut unused) = w.tx.send(self.reservation()) {
                unused.queue = Weak::new();
                let mut inner = self.lock();
                inner.reserved = inner.reserved.saturating_sub(1);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a request may pass at once, nobody waiting: some available
    /// instance is under `max_in_flight` and its engine is not saturated,
    /// beyond the room already promised to released requests.
    fn open(fleet: &Fleet, reserved: usize) -> bool {
        let c = &fleet.config;
        let free: usize = fleet
            .instances
            .iter()
            .filter(|i| i.available() && !i.engine_saturated(c.max_waiting, c.max_kv_usage))
            .map(|i| c.max_in_flight.saturating_sub(i.in_flight()))
            .sum();
        free > reserved
    }

    /// How many held-back requests the fleet takes now: per available
    /// instance, the fewer of its free slots under `max_in_flight` and its
    /// engine's room (`EngineLoad::room`: one a request ended there, once it
    /// queues); less the room already promised to released requests.
    fn room(fleet: &Fleet, reserved: usize) -> usize {
        let c = &fleet.config;
        let free: usize = fleet
            .instances
            .iter()
            .filter(|i| i.available())
            .map(|i| {
                let slots = c.max_in_flight.saturating_sub(i.in_flight());
                match i.engine_room(c.max_waiting, c.max_kv_usage) {
                    Some(r) => slots.min(usize::try_from(r).unwrap_or(usize::MAX)),
                    None => slots,
                }
            })
            .sum();
        free.saturating_sub(reserved)
    }

    /// Whether a request arriving now would wait (for `explain`).
    pub fn would_wait(&self) -> bool {
        let fleet = self.fleet.load();
        fleet.config.enabled && {
            let inner = self.lock();
            !inner.order.is_empty() || !Self::open(&fleet, inner.reserved)
        }
    }

    /// Wait for room, or pass at once when there is some and nobody waits.
    /// `None`: queueing is off. The reservation is held until the request
    /// has taken its instance's slot.
    pub async fn enter(&self, ask: Ask<'_>) -> Result<Option<Reservation>, ApiError> {
        let fleet = self.fleet.load_full();
        // Off, or nothing to wait for: with no instance available the
        // request goes on to be answered 503 (or tried on one unconfirmed).
        if !fleet.config.enabled || !fleet.instances.iter().any(|i| i.available()) {
            return Ok(None);
        }
        let labels = (self.endpoint.as_str(), ask.tenant, ask.priority.name());
        let (rx, id) = {
            let mut inner = self.lock();
            if inner.closed {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    "the gateway is shutting down",
                ));
            }
            if inner.order.is_empty() && Self::open(&fleet, inner.reserved) {
                inner.reserved += 1;
                let weighted = fleet.config.input_weight * ask.prompt_tokens as f64;
                inner.order.served_at_once(ask.tenant, weighted, ask.weight);
                crate::telemetry::tenant_service(&self.endpoint, ask.tenant, weighted);
                crate::telemetry::queue_released(labels, 0.0);
                return Ok(Some(self.reservation()));
            }
            if inner.order.len() >= fleet.config.max_length {
                crate::telemetry::queue_timeout(labels);
                return Err(refused(format!(
                    "the fleet is saturated and {} requests already wait",
                    inner.order.len()
                )));
            }
            let (tx, rx) = oneshot::channel();
            let waiting = Waiting {
                tx,
                prompt_tokens: ask.prompt_tokens,
                weight: ask.weight,
            };
            let id = inner.order.push(ask.tenant, ask.priority, waiting);
            self.waiting.store(inner.order.len(), Ordering::Relaxed);
            crate::telemetry::queue_waiting(labels, inner.order.waiting(ask.tenant, ask.priority));
            (rx, id)
        };
        // A slot may have freed between the room check and the push, its
        // pump seeing nobody waiting yet.
        self.pump();
        let started = Instant::now();
        // Takes the request out if the client leaves or the wait runs out.
        let queued = Queued {
            queue: self,
            ask: &ask,
            id,
        };
        match tokio::time::timeout(fleet.config.max_wait, rx).await {
            Ok(Ok(reservation)) => {
                // Popped already: its drop finds nothing to take out.
                drop(queued);
                crate::telemetry::queue_released(labels, started.elapsed().as_secs_f64());
                Ok(Some(reservation))
            }
            // Shutdown refused everything waiting.
            Ok(Err(_)) => Err(ApiError::new(
                ErrorKind::Unavailable,
                "the gateway is shutting down",
            )),
            Err(_) => {
                drop(queued);
                crate::telemetry::queue_timeout(labels);
                Err(refused(format!(
                    "the fleet stayed saturated for {} ms",
                    fleet.config.max_wait.as_millis()
                )))
            }
        }
    }

    fn reservation(&self) -> Reservation {
        Reservation {
            queue: Weak::clone(&self.me),
        }
    }

    /// Service for a released request's prompt, counted at its release so
    /// that the next choice, in the same pump, already sees it.
    fn charge_input(
        &self,
        inner: &mut Inner,
        config: &QueueConfig,
        tenant: &str,
        prompt_tokens: u64,
        weight: f64,
    ) {
        let weighted = config.input_weight * prompt_tokens as f64;
        inner.order.charge(tenant, weighted, weight);
        crate::telemetry::tenant_service(&self.endpoint, tenant, weighted);
    }

    /// Count a finished request's output tokens as service to its tenant.
    pub fn charge_output(&self, tenant: &str, weight: f64, completion_tokens: u64) {
        let config = &self.fleet.load().config;
        let weighted = config.output_weight * completion_tokens as f64;
        self.lock().order.charge(tenant, weighted, weight);
        crate::telemetry::tenant_service(&self.endpoint, tenant, weighted);
    }

    /// Release waiting requests while there is room: called when a slot
    /// frees, a reservation is used, or engines report less load.
    pub fn pump(&self) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let fleet = self.fleet.load();
        let mut inner = self.lock();
        while !inner.order.is_empty() && Self::room(&fleet, inner.reserved) > 0 {
            let Some((tenant, priority, w)) = inner.order.pop() else {
                break;
            };
            self.charge_input(
                &mut inner,
                &fleet.config,
                &tenant,
                w.prompt_tokens,
                w.weight,
            );
            crate::telemetry::queue_waiting(
                (&self.endpoint, &tenant, priority.name()),
                inner.order.waiting(&tenant, priority),
            );
            inner.reserved += 1;
            if let Err(mut unused) = w.tx.send(self.reservation()) {
                // Its client left between the pop and now.
                unused.queue = Weak::new();
                inner.reserved -= 1;
            }
        }
        self.waiting.store(inner.order.len(), Ordering::Relaxed);
    }

    /// Every tenant's service as this replica alone counted it, ever (for
    /// the other replicas).
    pub fn own_service(&self) -> Vec<(String, f64)> {
        self.lock().order.own_service()
    }

    /// The other replicas' service to each tenant, summed (their totals):
    /// what grew since the last round is counted here. A total that went
    /// down (a replica gone) counts nothing and becomes the new mark; a
    /// tenant missing from a round keeps its mark.
    pub fn set_peer_service(&self, totals: &std::collections::HashMap<String, f64>) {
        if totals.is_empty() && self.lock().peer_service.is_empty() {
            return;
        }
        let mut inner = self.lock();
        let inner = &mut *inner;
        for (tenant, &total) in totals {
            let seen = inner.peer_service.entry(tenant.clone()).or_insert(0.0);
            let grew = total - *seen;
            *seen = total;
            if grew > 0.0 {
                inner.order.peer_served(tenant, grew);
            }
        }
    }

    /// Shutdown: refuse everything waiting, and whatever comes later.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        drop(inner.order.drain());
        self.waiting.store(0, Ordering::Relaxed);
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every tenant's weighted service and waiting requests, read under the
    /// queue's lock once (the console samples it once a second, whoever watches).
    pub fn tenants(&self) -> Vec<(Arc<str>, f64, usize)> {
        self.lock().order.tenants()
    }
}

fn refused(message: String) -> ApiError {
    ApiError::new(ErrorKind::QueueTimeout, message).with_header(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    )
}

/// A queued request's place, given up if its future is dropped.
struct Queued<'a> {
    queue: &'a FairQueue,
    ask: &'a Ask<'a>,
    id: u64,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut inner = self.queue.lock();
        if inner
            .order
            .remove(self.ask.tenant, self.ask.priority, self.id)
            .is_some()
        {
            self.queue
                .waiting
                .store(inner.order.len(), Ordering::Relaxed);
            crate::telemetry::queue_waiting(
                (
                    &self.queue.endpoint,
                    self.ask.tenant,
                    self.ask.priority.name(),
                ),
                inner.order.waiting(self.ask.tenant, self.ask.priority),
            );
        }
    }
}

/// Room promised to a released request until it holds an instance's slot.
#[derive(Debug)]
pub struct Reservation {
    queue: Weak<FairQueue>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(q) = self.queue.upgrade() {
            let mut inner = q.lock();
            inner.reserved = inner.reserved.saturating_sub(1);
            drop(inner);
            q.pump();
        }
    }
}

/// What an instance tells its endpoint's queue when one of its slots frees.
impl crate::fleet::instance::Freed for FairQueue {
    fn freed(&self) {
        self.pump();
    }
}
