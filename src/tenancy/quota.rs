//! Per-tenant quotas: concurrency, requests per minute, tokens per minute.
//!
//! - **Concurrency** is a counter and an RAII slot. The slot rides in the
//!   request's [`Admission`], which the upstream response body holds until it
//!   ends or the client leaves, so the slot is freed exactly then.
//! - **Requests per minute** is governor's GCRA: lock-free, burst = the limit.
//! - **Tokens per minute** counts prompt *and* completion tokens, as
//!   OpenAI's limits do. Before forwarding, kvgate charges an estimate of
//!   the prompt, `ceil(body bytes / 4)` — no tokenizer on the latency path.
//!   When the response ends, the charge is settled with the `usage` the
//!   upstream reported (`prompt_tokens + completion_tokens`, see
//!   `upstream/usage.rs`); a stream without usage (no `include_usage`)
//!   keeps the prompt estimate and adds the completion tokens counted from
//!   the streamed text after it ended (`upstream/completion.rs`); an
//!   upstream error keeps the estimate. See [`super::bucket`] for why not
//!   governor.
//!
//! With `cluster.redis` every limit is shared by all replicas through Redis
//! ([`crate::cluster`]); what Redis cannot decide in time is decided here on
//! this replica's share of the limit.
//!
//! A refused request consumes nothing: checks run concurrency → tokens →
//! requests, and a later refusal undoes the earlier charges.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use axum::http::{HeaderName, HeaderValue, header};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::bucket::TokenBucket;
use super::settings::{Limits, TenancyConfig};
use crate::error::{ApiError, ErrorKind};
use crate::telemetry::live::{Refusal, TenantLive};
use crate::tenancy::cluster::{Cluster, ClusterSlot, Refused};

type Rpm = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// `x-ratelimit-*` (and on refusal `retry-after`) response headers.
pub type RateHeaders = Vec<(HeaderName, HeaderValue)>;

/// The pre-forwarding token estimate: about four bytes a token for English
/// text and JSON. Settlement corrects it, so it only has to be cheap and
/// roughly right.
pub fn estimate_tokens(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}

/// One tenant's limits, counters and cache salt.
#[derive(Debug)]
pub struct TenantState {
    pub id: Arc<str>,
    pub limits: Limits,
    /// `cache_salt` for this tenant's OpenAI-shaped bodies, when salting is on.
    pub salt: Option<String>,
    /// This replica's requests in flight (admitted locally or through Redis).
    inflight: Arc<AtomicU32>,
    /// Limiters for this replica alone: the whole limit without a cluster,
    /// its share while Redis is away.
    local: ArcSwap<Local>,
    /// The console's figures (last minute, refusals), kept across reloads.
    pub live: Arc<TenantLive>,
}

/// Local limiters sized at `1 / share` of each limit.
#[derive(Debug)]
struct Local {
    share: u32,
    concurrency: Option<u32>,
    rpm: Option<(NonZeroU32, Arc<Rpm>)>,
    tpm: Option<Arc<TokenBucket>>,
}

impl Local {
    fn new(limits: &Limits, share: u32) -> Self {
        let share = share.max(1);
        Self {
            share,
            concurrency: limits.max_concurrency.map(|n| n.div_ceil(share)),
            rpm: limits.requests_per_minute.map(|n| {
                let n = NonZeroU32::new(n.get().div_ceil(share)).unwrap_or(NonZeroU32::MIN);
                (n, Arc::new(rpm_limiter(n)))
            }),
            tpm: limits.tokens_per_minute.map(|n| {
                let n = n.get().div_ceil(u64::from(share)).max(1);
                Arc::new(TokenBucket::per_minute(n, Instant::now()))
            }),
        }
    }

    /// As [`Local::new`] at the whole limit, reusing the limiters of `old`
    /// (whole-limit ones) whose limit is unchanged.
    fn carried(limits: &Limits, old: Option<(&Limits, Arc<Local>)>) -> Self {
        let mut new = Self::new(limits, 1);
        if let Some((was, local)) = old.filter(|(_, l)| l.share == 1) {
            if was.requests_per_minute == limits.requests_per_minute {
                new.rpm.clone_from(&local.rpm);
            }
            if was.tokens_per_minute == limits.tokens_per_minute {
                new.tpm.clone_from(&local.tpm);
            }
        }
        new
    }
}

impl TenantState {
    fn new(id: &Arc<str>, config: &TenancyConfig, old: Option<&TenantState>) -> Self {
        let limits = config.tenants.limits(id).clone();
        // Keep limiters whose limits did not change, so a reload refills nothing.
        let local = Local::carried(&limits, old.map(|o| (&o.limits, o.local.load_full())));
        Self {
            id: Arc::clone(id),
            salt: config
                .salt_secret
                .as_ref()
                .map(|k| super::salt::for_tenant(k, id)),
            // Requests in flight stay counted across a reload.
            inflight: old.map_or_else(Default::default, |o| Arc::clone(&o.inflight)),
            live: old.map_or_else(Default::default, |o| Arc::clone(&o.live)),
            limits,
            local: ArcSwap::from_pointee(local),
        }
    }

    /// The local limiters for `share`, rebuilt when the share changed.
    fn local(&self, share: u32) -> Arc<Local> {
        let cur = self.local.load_full();
        if cur.share == share.max(1) {
            return cur;
        }
        let next = Arc::new(Local::new(&self.limits, share));
        self.local.store(Arc::clone(&next));
        next
    }

    /// Take a concurrency slot now (none without a concurrency limit), or
    /// refuse with a 429. The claim layer calls this from the headers, so a
    /// request holds its slot while its body is read.
    pub async fn take_slot(
        &self,
        cluster: Option<&Arc<Cluster>>,
    ) -> Result<Option<Slot>, ApiError> {
        match self.limits.max_concurrency {
            None => Ok(None),
            Some(max) => Ok(Some(self.claim(max, cluster).await?)),
        }
    }

    /// Admit one request estimated at `estimate` prompt tokens, with the slot
    /// it already holds (one is taken if not), or refuse it with a 429 that
    /// says when to come back. With a `cluster`, the limits hold across every
    /// replica (see [`crate::cluster`]); a limit Redis cannot decide in time
    /// is decided here, on this replica's share.
    pub async fn admit(
        &self,
        estimate: u64,
        cluster: Option<&Arc<Cluster>>,
        held: Option<Slot>,
    ) -> Result<(Admission, RateHeaders), ApiError> {
        let slot = match held {
            Some(slot) => Some(slot),
            None => self.take_slot(cluster).await?,
        };
        let (tpm, headers) = self.charge(estimate, cluster).await?;
        let admission = Admission {
            _slot: slot,
            tpm: Mutex::new(tpm),
            served: Mutex::new(None),
            live: Arc::clone(&self.live),
        };
        Ok((admission, headers))
    }

    async fn claim(&self, max: u32, cluster: Option<&Arc<Cluster>>) -> Result<Slot, ApiError> {
        let refused = || {
            limited(
                "too many concurrent requests for this tenant",
                Duration::from_secs(1),
            )
            .with_header(n("x-ratelimit-limit-concurrency"), num(max.into()))
            .with_header(n("x-ratelimit-remaining-concurrency"), num(0))
        };
        let share = match cluster {
            None => 1,
            Some(c) => match c.claim_slot(&self.id, max).await {
                Some(Ok(shared)) => {
                    self.inflight.fetch_add(1, Ordering::AcqRel);
                    return Ok(Slot {
                        inflight: Arc::clone(&self.inflight),
                        _shared: Some(shared),
                    });
                }
                Some(Err(_)) => return Err(refused()),
                None => {
                    fallback("concurrency");
                    c.share()
                }
            },
        };
        let local_max = self.local(share).concurrency.unwrap_or(max);
        self.inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < local_max).then_some(n + 1)
            })
            .map_err(|_| refused())?;
        Ok(Slot {
            inflight: Arc::clone(&self.inflight),
            _shared: None,
        })
    }

    /// Tokens, then requests; a refusal of either charges neither.
    async fn charge(
        &self,
        estimate: u64,
        cluster: Option<&Arc<Cluster>>,
    ) -> Result<(Option<Charge>, RateHeaders), ApiError> {
        let tpm_limit = self.limits.tokens_per_minute.map(NonZeroU64::get);
        let rpm_limit = self.limits.requests_per_minute.map(NonZeroU32::get);
        if tpm_limit.is_none() && rpm_limit.is_none() {
            return Ok((None, RateHeaders::new()));
        }
        let share = match cluster {
            None => 1,
            Some(c) => match c.charge(&self.id, tpm_limit, estimate, rpm_limit).await {
                Some(Ok(left)) => {
                    let mut headers = RateHeaders::new();
                    if let (Some(limit), Some(left)) = (tpm_limit, left.tokens_left) {
                        headers.push((n("x-ratelimit-limit-tokens"), num(limit)));
                        headers.push((n("x-ratelimit-remaining-tokens"), num(left)));
                    }
                    if let (Some(limit), Some(left)) = (rpm_limit, left.requests_left) {
                        headers.push((n("x-ratelimit-limit-requests"), num(limit.into())));
                        headers.push((n("x-ratelimit-remaining-requests"), num(left)));
                    }
                    let charge = tpm_limit.map(|limit| Charge::Shared {
                        cluster: Arc::clone(c),
                        tenant: Arc::clone(&self.id),
                        limit,
                        charged: estimate,
                    });
                    return Ok((charge, headers));
                }
                Some(Err(Refused::Tokens(wait))) => {
                    return Err(tokens_refused(tpm_limit.unwrap_or(0), wait));
                }
                Some(Err(Refused::Requests(wait))) => {
                    return Err(requests_refused(rpm_limit.unwrap_or(0), wait));
                }
                Some(Err(Refused::Concurrency)) => return Ok((None, RateHeaders::new())),
                None => {
                    fallback("rate");
                    c.share()
                }
            },
        };
        let local = self.local(share);
        let mut headers = RateHeaders::new();
        let now = Instant::now();
        let tpm = match &local.tpm {
            None => None,
            Some(b) => {
                let left = b
                    .take(estimate, now)
                    .map_err(|wait| tokens_refused(b.capacity(), wait))?;
                headers.push((n("x-ratelimit-limit-tokens"), num(b.capacity())));
                headers.push((n("x-ratelimit-remaining-tokens"), num(left)));
                Some(Charge::Local(Arc::clone(b), estimate))
            }
        };
        if let Some((limit, rpm)) = &local.rpm {
            match rpm.check() {
                Ok(snapshot) => {
                    headers.push((n("x-ratelimit-limit-requests"), num(limit.get().into())));
                    let left = snapshot.remaining_burst_capacity();
                    headers.push((n("x-ratelimit-remaining-requests"), num(left.into())));
                }
                Err(not_until) => {
                    if let Some(Charge::Local(b, charged)) = &tpm {
                        b.settle(*charged, 0, now);
                    }
                    let wait = not_until.wait_time_from(DefaultClock::default().now());
                    return Err(requests_refused(limit.get(), wait));
                }
            }
        }
        Ok((tpm, headers))
    }

    /// Requests of this tenant now in flight on this replica.
    pub fn in_flight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire)
    }
}

/// A limit decided locally because Redis could not answer in time.
fn fallback(limit: &'static str) {
    metrics::counter!(crate::telemetry::CLUSTER_FALLBACK, "limit" => limit).increment(1);
}

/// Which limit a refusal from [`TenantState::take_slot`] or
/// [`TenantState::admit`] names, for the console's count by reason.
pub fn refusal_of(e: &ApiError) -> Refusal {
    if e.message.starts_with("tokens per minute") {
        Refusal::TokensPerMinute
    } else if e.message.starts_with("requests per minute") {
        Refusal::RequestsPerMinute
    } else {
        Refusal::Concurrency
    }
}

fn tokens_refused(limit: u64, wait: Duration) -> ApiError {
    limited("tokens per minute exceeded for this tenant", wait)
        .with_header(n("x-ratelimit-limit-tokens"), num(limit))
        .with_header(n("x-ratelimit-remaining-tokens"), num(0))
        .with_header(n("x-ratelimit-reset-tokens"), secs(wait))
}

fn requests_refused(limit: u32, wait: Duration) -> ApiError {
    limited("requests per minute exceeded for this tenant", wait)
        .with_header(n("x-ratelimit-limit-requests"), num(limit.into()))
        .with_header(n("x-ratelimit-remaining-requests"), num(0))
        .with_header(n("x-ratelimit-reset-requests"), secs(wait))
}

fn rpm_limiter(n: NonZeroU32) -> Rpm {
    RateLimiter::direct(Quota::per_minute(n)).with_middleware::<StateInformationMiddleware>()
}

/// A 429 with `retry-after` in whole seconds, rounded up, at least 1.
fn limited(message: &str, wait: Duration) -> ApiError {
    ApiError::new(ErrorKind::RateLimited, message)
        .with_header(header::RETRY_AFTER, secs_plain(wait))
}

fn whole_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

fn secs_plain(d: Duration) -> HeaderValue {
    num(whole_secs(d))
}

/// OpenAI writes resets as durations like `12s`.
fn secs(d: Duration) -> HeaderValue {
    HeaderValue::from_str(&format!("{}s", whole_secs(d))).unwrap_or(HeaderValue::from_static("1s"))
}

fn num(v: u64) -> HeaderValue {
    HeaderValue::from(v)
}

fn n(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

/// One concurrency slot of a tenant, released on drop: the local count,
/// and the shared slot when Redis granted it.
#[derive(Debug)]
pub struct Slot {
    inflight: Arc<AtomicU32>,
    _shared: Option<ClusterSlot>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A token charge waiting for the tokens the request really used.
#[derive(Debug)]
pub enum Charge {
    Local(Arc<TokenBucket>, u64),
    Shared {
        cluster: Arc<Cluster>,
        tenant: Arc<str>,
        limit: u64,
        charged: u64,
    },
}

impl Charge {
    /// Replace the estimate with the request's real cost: the reported
    /// prompt tokens (or, unreported, the estimate) plus `completion`.
    pub fn settle(self, prompt_tokens: Option<u64>, completion_tokens: u64) {
        match self {
            Charge::Local(bucket, charged) => {
                let actual = prompt_tokens.unwrap_or(charged) + completion_tokens;
                bucket.settle(charged, actual, Instant::now());
            }
            Charge::Shared {
                cluster,
                tenant,
                limit,
                charged,
            } => {
                let actual = prompt_tokens.unwrap_or(charged) + completion_tokens;
                cluster.settle(&tenant, limit, charged, actual);
            }
        }
    }
}

/// What an admitted request holds until its response ends: the concurrency
/// slot and the token charge to settle.
#[derive(Debug)]
pub struct Admission {
    _slot: Option<Slot>,
    tpm: Mutex<Option<Charge>>,
    /// Told the completion tokens when the response ends (the fair queue
    /// counts them as the tenant's service).
    served: Mutex<Option<OnServed>>,
    /// The tenant's console figures, told the tokens used.
    live: Arc<TenantLive>,
}

/// A callback for a request's completion tokens.
pub struct OnServed(Box<dyn FnOnce(u64) + Send>);

impl OnServed {
    pub fn call(self, completion_tokens: u64) {
        (self.0)(completion_tokens);
    }
}

impl std::fmt::Debug for OnServed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnServed")
    }
}

impl Admission {
    /// The request used `tokens` (prompt and completion), for the console.
    pub fn used(&self, tokens: u64) {
        self.live.used(tokens);
    }

    /// Call `f` with the completion tokens once they are known.
    pub fn on_served(&self, f: impl FnOnce(u64) + Send + 'static) {
        *self.served.lock().unwrap_or_else(|e| e.into_inner()) = Some(OnServed(Box::new(f)));
    }

    /// The response ended with `completion_tokens` generated.
    pub fn served(&self, completion_tokens: u64) {
        if let Some(f) = self.take_served() {
            f.call(completion_tokens);
        }
    }

    /// Whether the fair queue waits for this request's completion tokens.
    pub fn counts_service(&self) -> bool {
        self.served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The callback, to call later (once a stream's tokens are counted).
    pub fn take_served(&self) -> Option<OnServed> {
        self.served.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The token charge, to settle once the request's tokens are known;
    /// `None` when the tenant has no token limit or it was already taken.
    /// Dropping it unsettled keeps the estimate charged.
    pub fn take_charge(&self) -> Option<Charge> {
        self.tpm.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Settle now with what the upstream reported (see [`Charge::settle`]);
    /// nothing reported keeps the estimate.
    pub fn settle(&self, prompt_tokens: Option<u64>, completion_tokens: u64) {
        if prompt_tokens.is_none() && completion_tokens == 0 {
            return;
        }
        if let Some(c) = self.take_charge() {
            c.settle(prompt_tokens, completion_tokens);
        }
    }

    /// Whether the tenant's tokens per minute still wait for this request's count.
    pub fn counts_tokens(&self) -> bool {
        self.tpm.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// Every tenant seen so far, created on first use with its configured or
/// default limits. Ids come only from verified credentials, so the map grows
/// with the issuer's tenants, not with what clients make up.
#[derive(Debug, Default)]
pub struct Registry {
    tenants: RwLock<HashMap<Arc<str>, Arc<TenantState>>>,
}

impl Registry {
    pub fn build(config: &TenancyConfig, previous: Option<&Registry>) -> Self {
        let map = previous
            .map(|p| {
                let old = p.tenants.read().unwrap_or_else(|e| e.into_inner());
                old.iter()
                    .map(|(id, st)| {
                        (
                            Arc::clone(id),
                            Arc::new(TenantState::new(id, config, Some(st))),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            tenants: RwLock::new(map),
        }
    }

    /// Every tenant seen so far (for the console; not on the request path).
    pub fn all(&self) -> Vec<Arc<TenantState>> {
        let map = self.tenants.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = map.values().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    pub fn get(&self, id: &Arc<str>, config: &TenancyConfig) -> Arc<TenantState> {
        if let Some(s) = self
            .tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            return Arc::clone(s);
        }
        let mut w = self.tenants.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            w.entry(Arc::clone(id))
                .or_insert_with(|| Arc::new(TenantState::new(id, config, None))),
        )
    }
}
