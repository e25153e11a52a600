//! Per-tenant quotas: concurrency, requests per minute, tokens per minute.
//!
//! - **Concurrency** is a counter and an RAII slot. The slot rides in the
//!   request's [`Admission`], which the upstream response body holds until it
//!   ends or the client leaves, so the slot is freed exactly then.
//! - **Requests per minute** is governor's GCRA: lock-free, burst = the limit.
//! - **Tokens per minute** counts *prompt* tokens. Before forwarding, kvgate
//!   charges an estimate of `ceil(body bytes / 4)` — no tokenizer on the
//!   latency path. When the response ends, the charge is settled with the
//!   `usage.prompt_tokens` the upstream reported (see `upstream/usage.rs`);
//!   without a reported usage (a stream without `include_usage`, an upstream
//!   error) the estimate stands. See [`super::bucket`] for why not governor.
//!
//! A refused request consumes nothing: checks run concurrency → tokens →
//! requests, and a later refusal undoes the earlier charges.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::http::{HeaderName, HeaderValue, header};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::bucket::TokenBucket;
use super::settings::{Limits, TenancyConfig};
use crate::error::{ApiError, ErrorKind};

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
    pub limits: Limits,
    /// `cache_salt` for this tenant's OpenAI-shaped bodies, when salting is on.
    pub salt: Option<String>,
    inflight: Arc<AtomicU32>,
    rpm: Option<Arc<Rpm>>,
    tpm: Option<Arc<TokenBucket>>,
}

impl TenantState {
    fn new(id: &str, config: &TenancyConfig, old: Option<&TenantState>) -> Self {
        let limits = config.tenants.limits(id).clone();
        // Keep a limiter whose limit did not change, so a reload refills nothing.
        let rpm = limits.requests_per_minute.map(|n| {
            old.filter(|o| o.limits.requests_per_minute == Some(n))
                .and_then(|o| o.rpm.clone())
                .unwrap_or_else(|| Arc::new(rpm_limiter(n)))
        });
        let tpm = limits.tokens_per_minute.map(|n| {
            old.filter(|o| o.limits.tokens_per_minute == Some(n))
                .and_then(|o| o.tpm.clone())
                .unwrap_or_else(|| Arc::new(TokenBucket::per_minute(n.get(), Instant::now())))
        });
        Self {
            salt: config
                .salt_secret
                .as_ref()
                .map(|k| super::salt::for_tenant(k, id)),
            // Requests in flight stay counted across a reload.
            inflight: old.map_or_else(Default::default, |o| Arc::clone(&o.inflight)),
            limits,
            rpm,
            tpm,
        }
    }

    /// Take a concurrency slot now (or none, with no concurrency limit), or
    /// refuse with a 429. The authentication layer calls this from the
    /// headers, so a request holds its slot while its body is read.
    pub fn claim(&self) -> Result<Option<Slot>, ApiError> {
        match self.limits.max_concurrency {
            None => Ok(None),
            Some(max) => Ok(Some(self.claim_slot(max).ok_or_else(|| {
                limited(
                    "too many concurrent requests for this tenant",
                    Duration::from_secs(1),
                )
                .with_header(n("x-ratelimit-limit-concurrency"), num(max.into()))
                .with_header(n("x-ratelimit-remaining-concurrency"), num(0))
            })?)),
        }
    }

    /// Admit one request estimated at `estimate` prompt tokens, with the slot
    /// it already holds (one is claimed if not), or refuse it with a 429 that
    /// says when to come back.
    pub fn admit(
        &self,
        estimate: u64,
        held: Option<Slot>,
    ) -> Result<(Admission, RateHeaders), ApiError> {
        let mut headers = RateHeaders::new();
        let slot = match held {
            Some(slot) => Some(slot),
            None => self.claim()?,
        };
        let now = Instant::now();
        let tpm = match &self.tpm {
            None => None,
            Some(b) => {
                let left = b.take(estimate, now).map_err(|wait| {
                    limited("tokens per minute exceeded for this tenant", wait)
                        .with_header(n("x-ratelimit-limit-tokens"), num(b.capacity()))
                        .with_header(n("x-ratelimit-remaining-tokens"), num(0))
                        .with_header(n("x-ratelimit-reset-tokens"), secs(wait))
                })?;
                headers.push((n("x-ratelimit-limit-tokens"), num(b.capacity())));
                headers.push((n("x-ratelimit-remaining-tokens"), num(left)));
                Some((Arc::clone(b), estimate))
            }
        };
        if let (Some(rpm), Some(limit)) = (&self.rpm, self.limits.requests_per_minute) {
            match rpm.check() {
                Ok(snapshot) => {
                    headers.push((n("x-ratelimit-limit-requests"), num(limit.get().into())));
                    let left = snapshot.remaining_burst_capacity();
                    headers.push((n("x-ratelimit-remaining-requests"), num(left.into())));
                }
                Err(not_until) => {
                    if let Some((b, charged)) = &tpm {
                        b.settle(*charged, 0, now);
                    }
                    let wait = not_until.wait_time_from(DefaultClock::default().now());
                    return Err(
                        limited("requests per minute exceeded for this tenant", wait)
                            .with_header(n("x-ratelimit-limit-requests"), num(limit.get().into()))
                            .with_header(n("x-ratelimit-remaining-requests"), num(0))
                            .with_header(n("x-ratelimit-reset-requests"), secs(wait)),
                    );
                }
            }
        }
        let admission = Admission {
            _slot: slot,
            tpm,
            settled: AtomicBool::new(false),
        };
        Ok((admission, headers))
    }

    fn claim_slot(&self, max: u32) -> Option<Slot> {
        self.inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(&self.inflight)))
    }

    /// Requests of this tenant now in flight.
    pub fn in_flight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire)
    }
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

/// One concurrency slot of a tenant, released on drop.
#[derive(Debug)]
pub struct Slot(Arc<AtomicU32>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What an admitted request holds until its response ends: the concurrency
/// slot and the token charge to settle.
#[derive(Debug)]
pub struct Admission {
    _slot: Option<Slot>,
    tpm: Option<(Arc<TokenBucket>, u64)>,
    settled: AtomicBool,
}

impl Admission {
    /// Replace the token estimate with what the upstream reported. Called
    /// once when the response body ends; `None` keeps the estimate.
    pub fn settle(&self, prompt_tokens: Option<u64>) {
        if let (Some(actual), Some((bucket, charged))) = (prompt_tokens, &self.tpm)
            && !self.settled.swap(true, Ordering::AcqRel)
        {
            bucket.settle(*charged, actual, Instant::now());
        }
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
