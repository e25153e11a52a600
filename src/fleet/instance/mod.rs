//! One upstream instance: its identity, in-flight count and cool-down.
//!
//! The in-flight count rises in [`Instance::claim`] and falls when the
//! returned [`InflightGuard`] drops — which the response body does when it
//! ends, errors, times out or is dropped by a departing client. RAII makes a
//! leak impossible short of leaking the guard itself. The guard also holds the
//! request's charge on the instance's queued prefill ([`Load::queued_prefill`]),
//! given back at the response's first body byte (the engine has prefilled it)
//! or when the guard drops, whichever comes first; until then the queue is
//! believed to drain at the instance's learned prefill rate ([`Drain`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{OnceLock, Weak};
use std::time::{Duration, Instant};

use axum::http::uri::{Authority, PathAndQuery, Scheme};
use axum::http::{HeaderValue, Uri};

use crate::kv_events::feed::FeedSettings;
use crate::kv_events::{Feed, Subscription};
use crate::telemetry;
use kvgate_routing::drain::Drain;
use kvgate_routing::pace::Ahead;
use kvgate_routing::{BlockIndex, Load};

mod inflight;
pub use inflight::{InflightGuard, PaceSample};

// Every request's view reads the first fields (through `index`'s
// capacity) of every instance: in this order (`repr(C)`), on aligned cache
// lines, they are a few adjacent lines an instance, where Rust's own layout
// spread them over the whole struct (at 1,000 instances a view is mostly
// waiting for memory).
#[derive(Debug)]
#[repr(C, align(128))]
pub struct Instance {
    in_flight: AtomicUsize,
    /// Estimated prefill tokens of requests that have no first byte yet.
    queued_prefill: AtomicU64,
    /// Those requests, and their uncached tokens alone (without the
    /// overhead each is charged): what a first token waits for ([`Ahead`]).
    queued_requests: AtomicU64,
    queued_uncached: AtomicU64,
    /// Milliseconds since [`epoch`] until which the instance is skipped.
    cooldown_until: AtomicU64,
    /// Set by health checks; starts healthy so a new fleet serves at once.
    healthy: AtomicBool,
    draining: AtomicBool,
    /// Joined and being warmed: not offered to routing until done.
    warming: AtomicBool,
    /// What the engine is believed to have computed of those uncached tokens.
    drain: Drain,
    /// Prefill work sent here lately, decaying (a cost tie-break).
    recent_work: super::recent_work::RecentWork,
    /// Sessions started (or moved) here lately, decaying (where a session's
    /// first turn starts).
    recent_sessions: super::recent_work::RecentWork,
    /// Its prefill rate as first bytes show it.
    prefill_rate: super::prefill_rate::PrefillRate,
    /// What the other gateway replicas have dispatched here (`fleet::peers`).
    pub peer: super::peers::PeerLoad,
    /// Its load as its engine reports it (read for cache-aware routing and
    /// while queueing is on).
    pub engine: super::engine_load::EngineLoad,
    /// Its fixed cost of a request and prefill rate, fitted to its streamed
    /// first tokens (the cost model's overhead, `explain`'s `pace`).
    pub pace: kvgate_routing::pace::Pace,
    /// The block chains believed cached here (cache-aware strategies).
    pub index: BlockIndex,
    pub endpoint: String,
    pub id: String,
    pub url: String,
    /// `url` parsed once (scheme, authority, path prefix): a request's URI is
    /// built from these parts, not formatted and parsed again every time.
    base: Option<Base>,
    /// Its per-request metric series, resolved once.
    pub series: telemetry::UpstreamSeries,
    /// Its KV-event subscription (`kv_aware` with `kv_events` set).
    kv: arc_swap::ArcSwapOption<Subscription>,
    /// KV capacity in tokens as the engine reported it (0: not learned).
    learned_cache_tokens: AtomicUsize,
    /// Failed attempts to learn it.
    capacity_tries: AtomicU32,
    /// Consecutive failed requests (connection errors or 5xx), for passive ejection.
    failures: AtomicU32,
    /// Consecutive probe results in the current direction (health checks).
    probe_streak: AtomicU32,
    /// A health probe has succeeded at least once (what `/ready` waits for).
    confirmed: AtomicBool,
    /// Told when one of its slots frees: its endpoint's queue.
    freed: OnceLock<Weak<dyn Freed>>,
}

/// Something to tell when an instance's in-flight slot frees (the
/// endpoint's fair queue, which then releases a waiting request).
pub trait Freed: Send + Sync + std::fmt::Debug {
    fn freed(&self);
}

/// An instance URL's parts, for building request URIs.
#[derive(Debug)]
struct Base {
    scheme: Scheme,
    authority: Authority,
    /// The URL's path without its trailing `/` (usually empty).
    prefix: String,
    /// The `Host` header hyper's client would write (host, and the port when
    /// not the scheme's default), made once rather than formatted per request.
    host: Option<HeaderValue>,
}

impl Base {
    fn parse(url: &str) -> Option<Self> {
        let uri: Uri = url.parse().ok()?;
        let host = uri.host().and_then(|h| {
            let default = match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            };
            let value = match uri.port_u16().filter(|p| *p != default) {
                Some(port) => format!("{h}:{port}"),
                None => h.to_owned(),
            };
            HeaderValue::from_str(&value).ok()
        });
        let parts = uri.into_parts();
        Some(Self {
            host,
            scheme: parts.scheme?,
            authority: parts.authority?,
            prefix: parts
                .path_and_query
                .map(|p| p.path().trim_end_matches('/').to_owned())
                .unwrap_or_default(),
        })
    }
}

/// Consecutive 5xx answers that eject an instance passively.
pub const EJECT_AFTER_5XX: u32 = 3;
/// Backoff doublings are capped so an ejected instance is retried at least this often.
const MAX_COOLDOWN: Duration = Duration::from_secs(300);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds on the instances' clock: what [`Instance::load_at`] takes.
pub fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Instance {
    /// The URI of `path` (with its query, if any) on this instance, under
    /// the instance URL's own path; `None` if either does not parse.
    pub fn uri_for(&self, path: &str) -> Option<Uri> {
        self.request_target(path).map(|(uri, _)| uri)
    }

    /// [`Self::uri_for`], with the `Host` header the request carries there.
    pub fn request_target(&self, path: &str) -> Option<(Uri, Option<HeaderValue>)> {
        let base = self.base.as_ref()?;
        let path_and_query = if base.prefix.is_empty() {
            PathAndQuery::try_from(path).ok()?
        } else {
            PathAndQuery::try_from(format!("{}{path}", base.prefix)).ok()?
        };
        Uri::builder()
            .scheme(base.scheme.clone())
            .authority(base.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .ok()
            .map(|uri| (uri, base.host.clone()))
    }

    pub fn new(endpoint: &str, id: &str, url: &str) -> Arc<Self> {
        let series = telemetry::UpstreamSeries::new(endpoint, id);
        telemetry::healthy(endpoint, id, true);
        series.in_flight(0);
        Arc::new(Self {
            endpoint: endpoint.to_owned(),
            id: id.to_owned(),
            url: url.to_owned(),
            base: Base::parse(url),
            series,
            in_flight: AtomicUsize::new(0),
            queued_prefill: AtomicU64::new(0),
            queued_requests: AtomicU64::new(0),
            queued_uncached: AtomicU64::new(0),
            drain: Drain::default(),
            recent_work: Default::default(),
            recent_sessions: super::recent_work::RecentWork::with_half_life(
                super::recent_work::SESSION_HALF_LIFE_MS,
            ),
            prefill_rate: Default::default(),
            pace: Default::default(),
            index: BlockIndex::default(),
            kv: arc_swap::ArcSwapOption::empty(),
            learned_cache_tokens: AtomicUsize::new(0),
            capacity_tries: AtomicU32::new(0),
            cooldown_until: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            probe_streak: AtomicU32::new(0),
            confirmed: AtomicBool::new(false),
            warming: AtomicBool::new(false),
            engine: super::engine_load::EngineLoad::default(),
            peer: super::peers::PeerLoad::default(),
            freed: OnceLock::new(),
        })
    }

    /// Follow the KV events at `events` (replaying from `replay`), keeping a
    /// subscription already following the same sockets; `None` stops.
    pub fn follow_kv_events(
        &self,
        events: Option<&str>,
        replay: Option<&str>,
        settings: FeedSettings,
        fleet: &Arc<kvgate_routing::held::fleet::FleetHeld>,
    ) {
        let current = self.kv.load();
        let same = match (current.as_deref(), events) {
            (None, None) => true,
            (Some(sub), Some(url)) => {
                sub.feed.events_url == url
                    && sub.feed.replay_url.as_deref() == replay
                    && sub.feed.block_size == settings.block_size
                    && Arc::ptr_eq(sub.feed.fleet(), fleet)
            }
            _ => false,
        };
        if same {
            if let Some(sub) = current.as_deref() {
                sub.feed.update(settings);
            }
            return;
        }
        let next = events.and_then(|url| {
            Subscription::start(Feed::new(
                (&self.endpoint, &self.id),
                url,
                replay,
                settings,
                fleet,
            ))
        });
        self.kv.store(next.map(Arc::new));
    }

    /// The KV-event feed, when the instance has one.
    pub fn kv_feed(&self) -> Option<Arc<Subscription>> {
        self.kv.load_full()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Healthy, not cooling down, not warming, not draining.
    pub fn available(&self) -> bool {
        self.available_at(now_ms())
    }

    /// [`Self::available`] at `now` ([`now_ms`]).
    fn available_at(&self, now: u64) -> bool {
        !self.warming.load(Ordering::Relaxed)
            && !self.draining.load(Ordering::Relaxed)
            && self.healthy.load(Ordering::Relaxed)
            && self.cooldown_until.load(Ordering::Relaxed) <= now
    }

    /// Drained (by an operator): it takes no new request at all, not even as
    /// a last resort, while the ones it has finish. Kept across reloads.
    pub fn set_draining(&self, on: bool) {
        if self.draining.swap(on, Ordering::Relaxed) != on {
            tracing::warn!(endpoint = %self.endpoint, instance = %self.id, draining = on, "instance drain changed");
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Hold the instance back from routing while it is warmed (`warmup`).
    pub fn set_warming(&self, on: bool) {
        self.warming.store(on, Ordering::Relaxed);
    }

    pub fn is_warming(&self) -> bool {
        self.warming.load(Ordering::Relaxed)
    }

    /// Estimated prefill tokens waiting here.
    pub fn queued_prefill(&self) -> u64 {
        self.queued_prefill_at(now_ms())
    }

    /// [`Self::queued_prefill`] at `now` ([`now_ms`]): the charges not yet
    /// given back, less what the engine is believed to have computed of
    /// their uncached tokens since they queued ([`Drain`]).
    pub fn queued_prefill_at(&self, now: u64) -> u64 {
        let queued = self.queued_prefill.load(Ordering::Relaxed);
        queued.saturating_sub(self.drained(now).1)
    }

    /// The queued uncached tokens at `now`, and how many of them are
    /// believed computed already.
    fn drained(&self, now: u64) -> (u64, u64) {
        let queued = self.queued_uncached.load(Ordering::Relaxed);
        let done = self.drain.done(now, queued, self.prefill_tokens_per_s());
        (queued, done)
    }

    /// Its prefill rate in tokens a second: its pace's (streamed first
    /// tokens and gaps), else the first bytes'; 0 before either.
    fn prefill_tokens_per_s(&self) -> f64 {
        self.pace
            .tokens_per_s()
            .or_else(|| self.prefill_rate.tokens_per_s())
            .unwrap_or(0.0)
    }

    /// The queue of uncached tokens changes now: `left` of them leave it
    /// (a first token; 0 when a request joins).
    fn queue_changes(&self, left: u64) {
        let queued = self.queued_uncached.load(Ordering::Relaxed);
        self.drain
            .change(now_ms(), queued, self.prefill_tokens_per_s(), left);
    }

    /// KV capacity in tokens reported by the engine, once learned.
    pub fn learned_cache_tokens(&self) -> Option<usize> {
        Some(self.learned_cache_tokens.load(Ordering::Relaxed)).filter(|&t| t > 0)
    }

    pub fn set_learned_cache_tokens(&self, tokens: usize) {
        self.learned_cache_tokens.store(tokens, Ordering::Relaxed);
    }

    /// Not learned yet, and fewer than `max_tries` failed attempts.
    pub fn capacity_wanted(&self, max_tries: u32) -> bool {
        self.learned_cache_tokens().is_none()
            && self.capacity_tries.load(Ordering::Relaxed) < max_tries
    }

    /// Count a failed attempt; returns how many there have been.
    pub fn capacity_try_failed(&self) -> u32 {
        self.capacity_tries.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Load as a policy sees it; `matched_blocks` is the caller's to fill in.
    ///
    /// The fleet's, not this replica's: its own figures plus the other
    /// replicas' as of their last shared round (`fleet::peers`), and requests
    /// in flight at least as many as the engine itself last reported
    /// running and waiting, plus what this replica sent there since
    /// ([`super::engine_load::EngineLoad::in_flight_since_reading`]).
    pub fn load(&self) -> Load {
        self.load_at(now_ms())
    }

    /// [`Self::load`] at `now` ([`now_ms`]): a view of a whole fleet reads
    /// the clock once, not once an instance (a thousand clock reads are tens
    /// of microseconds).
    pub fn load_at(&self, now: u64) -> Load {
        let mut fleet = self.own_figures_at(now);
        fleet.add(&self.peer.get());
        let engine = self.engine.in_flight_since_reading(now).unwrap_or(0);
        Load {
            in_flight: usize::try_from(fleet.in_flight.max(engine)).unwrap_or(usize::MAX),
            available: self.available_at(now),
            queued_prefill: fleet.queued_prefill,
            waiting: usize::try_from(fleet.queued_requests).unwrap_or(usize::MAX),
            recent_work: fleet.recent_work,
            recent_sessions: fleet.recent_sessions,
            overhead_tokens: self.pace.overhead_tokens(),
            ..Load::default()
        }
    }

    /// This replica's own figures here, for the other replicas.
    pub fn own_figures(&self) -> super::peers::Figures {
        self.own_figures_at(now_ms())
    }

    fn own_figures_at(&self, now: u64) -> super::peers::Figures {
        super::peers::Figures {
            in_flight: self.in_flight() as u64,
            queued_prefill: self.queued_prefill_at(now),
            queued_requests: self.queued_requests.load(Ordering::Relaxed),
            recent_work: self.recent_work.get(now),
            recent_sessions: self.recent_sessions.get(now),
        }
    }

    /// Count a session that starts here (its first turn served here) or
    /// moves here.
    pub fn session_started(&self) {
        self.recent_sessions
            .add(kvgate_routing::SESSION_UNIT, now_ms());
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Whether a health probe has ever succeeded.
    pub fn confirmed(&self) -> bool {
        self.confirmed.load(Ordering::Relaxed)
    }

    pub fn set_healthy(&self, up: bool) {
        if self.healthy.swap(up, Ordering::Relaxed) != up {
            telemetry::healthy(&self.endpoint, &self.id, up);
            tracing::warn!(endpoint = %self.endpoint, instance = %self.id, healthy = up, "instance health changed");
        }
    }

    /// Skip this instance for `d` after a connection failure.
    pub fn cool_down(&self, d: Duration) {
        let until = now_ms().saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.cooldown_until.fetch_max(until, Ordering::Relaxed);
    }

    /// A connection failure: cool down at once, twice as long each time in a row.
    pub fn connect_failed(&self, base: Duration) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        self.cool_down(backoff(base, n));
    }

    /// A 5xx answer: after [`EJECT_AFTER_5XX`] in a row, cool down with backoff.
    pub fn server_error(&self, base: Duration) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= EJECT_AFTER_5XX {
            self.cool_down(backoff(base, n + 1 - EJECT_AFTER_5XX));
        }
    }

    /// Any answer that is not a 5xx ends a failure streak.
    pub fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// Record one health probe; flips health after `up`/`down` results in a row.
    pub fn probe(&self, ok: bool, up: u32, down: u32) {
        if ok {
            self.confirmed.store(true, Ordering::Relaxed);
        }
        let healthy = self.is_healthy();
        if ok == healthy {
            self.probe_streak.store(0, Ordering::Relaxed);
            return;
        }
        let n = self.probe_streak.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= if ok { up } else { down } {
            self.probe_streak.store(0, Ordering::Relaxed);
            self.set_healthy(ok);
            if ok {
                self.succeeded();
                self.cooldown_until.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Tell `hook` whenever a slot here frees; set once, by the endpoint
    /// that owns the instance (its queue is kept across reloads, as the
    /// instance is).
    pub fn notify_freed(&self, hook: Weak<dyn Freed>) {
        let _ = self.freed.set(hook);
    }

    /// Whether its engine's last reading says it is saturated (see
    /// `EngineLoad::saturated`).
    pub fn engine_saturated(&self, max_waiting: u64, max_kv_usage: f64) -> bool {
        self.engine.saturated(max_waiting, max_kv_usage, now_ms())
    }

    /// How many requests held back its engine takes now (see
    /// `EngineLoad::room`); `None` without a fresh reading.
    pub fn engine_room(&self, max_waiting: u64, max_kv_usage: f64) -> Option<u64> {
        self.engine.room(max_waiting, max_kv_usage, now_ms())
    }

    /// Record a reading of its engine's load, taken now.
    pub fn engine_read(&self, reading: super::engine_load::Reading) {
        self.engine.set(reading, now_ms());
    }

    /// The prefill queued here by this replica: tokens (without overheads)
    /// and requests, for a request about to be claimed ([`Ahead`]).
    /// What the engine is believed to have computed already is not ahead.
    pub fn queued_ahead(&self, own_uncached: u64) -> Ahead {
        let (queued, done) = self.drained(now_ms());
        Ahead {
            work: (queued - done).saturating_add(own_uncached),
            requests: self.queued_requests.load(Ordering::Relaxed),
        }
    }
}

fn backoff(base: Duration, n: u32) -> Duration {
    base.saturating_mul(1u32 << n.saturating_sub(1).min(10))
        .min(MAX_COOLDOWN)
}

#[cfg(test)]
mod tests;
