//! One publisher's view: the [`HeldIndex`] its events build, whether they can
//! be trusted right now, and the counts `explain` and `/metrics` show. The
//! subscriber task writes it; request routing reads it. Readers and the
//! writer do not wait for each other: trust, the blocks held and the oldest
//! expected prompt's time are atomics; the blocks themselves are in the
//! endpoint's fleet-wide index (`kvgate_routing::held::fleet`), whose shards
//! a writer takes one block at a time and a request's walk one key at a
//! time. The feed's own lock guards only what its writers use (engine
//! hashes, expected prompts, salts).
//!
//! Trust: events are used while the subscription is connected, the publisher
//! is not *silent* and the index is not *partial*. vLLM sends nothing when
//! idle, so silence alone means nothing; silence after the gateway sent the
//! instance a prompt that must store new blocks does: once such a request is
//! older than `silence` with no batch since, the instance falls back to the
//! approximate index until events flow again. Partial: the index missed part
//! of the publisher's history (first heard mid-stream with the replay buffer
//! no longer reaching back to batch 0, or a gap replay could not fill), so
//! blocks the engine already held are unknown, and new blocks under them are
//! dropped (their parent is unknown). It stays partial until `silence` has
//! passed with no such orphaned block. Replaying: the subscriber is catching
//! up (first contact, a reconnection, a restart, a gap, or recovering after
//! shedding), so the index is not yet what the engine holds: the instance is
//! routed as unknown until the catch-up ends.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::clock::{self, AtomicTime};
use super::wire::{Batch, Event};
use crate::telemetry;
use kvgate_routing::held::fleet::FleetHeld;
use kvgate_routing::held::{self, Held, HeldIndex, Scope, TierWeights};

/// Scopes (salt, partition) of recently sent prompts, by their first block's content key.
const PENDING_SALTS: usize = 4096;

/// How a feed judges and bounds what it hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedSettings {
    /// Unanswered requests older than this make the publisher silent.
    pub silence: Duration,
    /// Most engine blocks kept.
    pub limit: usize,
    /// The endpoint's `block_size`: events of another size cannot be matched.
    pub block_size: usize,
}

#[derive(Debug, Default)]
pub struct Counters {
    pub batches: AtomicU64,
    pub applied: AtomicU64,
    pub dropped: AtomicU64,
    pub gaps: AtomicU64,
    pub replays: AtomicU64,
    pub resets: AtomicU64,
    /// Batches read off the socket and not applied (overload; see `subscriber`).
    pub shed: AtomicU64,
    /// The last sequence number received, plus one (0: none yet).
    pub next_seq: AtomicU64,
}

#[derive(Debug)]
struct State {
    index: HeldIndex,
    /// Scope and send time of prompts whose first block the instance did not hold.
    pending: lru::LruCache<u64, (Scope, Instant)>,
    /// Prompts expected (see `HeldIndex::expect`), oldest first, with when they were sent.
    expecting: std::collections::VecDeque<(Instant, std::sync::Arc<[u64]>)>,
}

/// What routing reads of a feed besides its index, kept in atomics so that
/// it never waits for the subscriber: trust and the blocks held. A view
/// reads this of every instance, so it is one aligned pair of cache lines
/// (a fleet of 1,000 is 1,000 of them), not fields spread over the feed.
#[derive(Debug)]
#[repr(align(128))]
struct Hot {
    connected: AtomicBool,
    /// A catch-up is under way (see [`Trust::Replaying`]).
    replaying: AtomicBool,
    /// The last `trust` found it silent (to log the change once).
    was_silent: AtomicBool,
    /// `silence`, in ms (reloads change it in place).
    silence_ms: AtomicU64,
    /// The endpoint's fleet-wide index, and this instance's slot in it.
    fleet: Arc<FleetHeld>,
    slot: Option<u32>,
    last_batch: AtomicTime,
    /// Since when the index may lack blocks the engine holds.
    partial_since: AtomicTime,
    /// The last stored block dropped for an unknown parent.
    last_orphan: AtomicTime,
    /// The oldest request sent since the last batch that should make the
    /// instance store blocks.
    awaiting: AtomicTime,
    /// The index's length after the subscriber's last change.
    held: AtomicUsize,
    /// When the oldest prompt still expected was sent (the front of
    /// `State::expecting`), so a view sees stale ones without the lock.
    oldest_expected: AtomicTime,
}

/// Why an instance's figures come from where they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// From events; the last batch arrived `age` ago (`None`: none yet).
    Live { age: Option<Duration> },
    /// The subscription is down (publisher unreachable or restarting).
    Disconnected,
    /// Requests went unanswered by events for longer than `silence`.
    Silent,
    /// The index missed part of the publisher's history (see the module docs).
    Partial,
    /// The subscriber is catching up from the replay socket.
    Replaying,
}

impl Trust {
    pub fn is_live(self) -> bool {
        matches!(self, Self::Live { .. })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live { .. } => "events",
            Self::Disconnected => "disconnected",
            Self::Silent => "silent",
            Self::Partial => "partial",
            Self::Replaying => "replaying",
        }
    }
}

#[derive(Debug)]
pub struct Feed {
    /// Endpoint and instance ids, for logs and metric labels.
    pub labels: (String, String),
    pub events_url: String,
    pub replay_url: Option<String>,
    pub counters: Counters,
    /// A block size other than the endpoint's was reported (logged once).
    warned_block_size: AtomicBool,
    /// The endpoint's `block_size` (a change makes a new feed).
    pub block_size: usize,
    series: telemetry::KvSeries,
    hot: Hot,
    /// One lock an instance around what only its writers use (its engine
    /// hashes, expected prompts, salts); its blocks are in the endpoint's
    /// fleet-wide index, which views read without this lock.
    state: RwLock<State>,
}

impl Feed {
    pub fn new(
        (endpoint, instance): (&str, &str),
        events_url: &str,
        replay_url: Option<&str>,
        settings: FeedSettings,
        fleet: &Arc<FleetHeld>,
    ) -> Self {
        let index = HeldIndex::join(fleet, settings.limit);
        Self {
            labels: (endpoint.to_owned(), instance.to_owned()),
            series: telemetry::KvSeries::new(endpoint, instance),
            events_url: events_url.to_owned(),
            replay_url: replay_url.map(str::to_owned),
            counters: Counters::default(),
            warned_block_size: AtomicBool::new(false),
            block_size: settings.block_size,
            hot: Hot {
                connected: AtomicBool::new(false),
                replaying: AtomicBool::new(false),
                was_silent: AtomicBool::new(false),
                silence_ms: AtomicU64::new(
                    u64::try_from(settings.silence.as_millis()).unwrap_or(u64::MAX),
                ),
                fleet: Arc::clone(fleet),
                slot: index.slot(),
                last_batch: AtomicTime::default(),
                partial_since: AtomicTime::default(),
                last_orphan: AtomicTime::default(),
                awaiting: AtomicTime::default(),
                held: AtomicUsize::new(0),
                oldest_expected: AtomicTime::default(),
            },
            state: RwLock::new(State {
                index,
                pending: lru::LruCache::new(
                    std::num::NonZeroUsize::new(PENDING_SALTS)
                        .unwrap_or(std::num::NonZeroUsize::MIN),
                ),
                expecting: std::collections::VecDeque::new(),
            }),
        }
    }

    fn silence(&self) -> Duration {
        Duration::from_millis(self.hot.silence_ms.load(Ordering::Relaxed))
    }

    fn silence_ns(&self) -> u64 {
        self.hot
            .silence_ms
            .load(Ordering::Relaxed)
            .saturating_mul(1_000_000)
    }

    /// Apply a reload's silence and limit (the block size cannot change in place).
    pub fn update(&self, settings: FeedSettings) {
        let ms = u64::try_from(settings.silence.as_millis()).unwrap_or(u64::MAX);
        self.hot.silence_ms.store(ms, Ordering::Relaxed);
        self.lock().index.set_limit(settings.limit);
    }

    fn lock(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        // A panic while holding it cannot leave the index half-updated in a
        // way that matters for routing; keep serving.
        self.state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publish the index's length to readers (under the write lock).
    fn held_now(&self, st: &State) -> usize {
        let n = st.index.len();
        self.hot.held.store(n, Ordering::Relaxed);
        n
    }

    pub fn set_connected(&self, up: bool) {
        self.hot.connected.store(up, Ordering::Relaxed);
    }

    pub fn trust(&self, now: Instant) -> Trust {
        self.trust_at(clock::stamp(now))
    }

    /// [`Feed::trust`] at `now_ns` ([`clock::stamp`]): a view of a whole
    /// fleet converts its instant once, not once an instance.
    pub fn trust_at(&self, now_ns: u64) -> Trust {
        if !self.hot.connected.load(Ordering::Relaxed) {
            return Trust::Disconnected;
        }
        if self.hot.replaying.load(Ordering::Acquire) {
            return Trust::Replaying;
        }
        let t = &self.hot;
        let silence = self.silence();
        // Integer nanoseconds: every request's view calls this for every
        // instance, and `Instant` arithmetic a field was most of its cost.
        let silence_ns = self.silence_ns();
        let within = |age: Option<u64>| age.is_some_and(|a| a < silence_ns);
        if let Some(since) = t.partial_since.get() {
            if within(t.partial_since.age_ns(now_ns)) || within(t.last_orphan.age_ns(now_ns)) {
                return Trust::Partial;
            }
            t.partial_since.clear_if(since);
            tracing::info!(endpoint = %self.labels.0, instance = %self.labels.1, "KV event index complete again");
        }
        let silent = t.awaiting.age_ns(now_ns).is_some_and(|a| a > silence_ns);
        let age = t.last_batch.age_ns(now_ns).map(Duration::from_nanos);
        // Read before swapping: a swap writes, and every request's view
        // calls this for every instance.
        if self.hot.was_silent.load(Ordering::Relaxed) != silent
            && self.hot.was_silent.swap(silent, Ordering::Relaxed) != silent
        {
            if silent {
                tracing::warn!(endpoint = %self.labels.0, instance = %self.labels.1, events = %self.events_url, silence = ?silence, "KV events went silent after requests that must store blocks; approximate index until they resume");
            } else {
                tracing::info!(endpoint = %self.labels.0, instance = %self.labels.1, "KV events resumed");
            }
        }
        if silent {
            Trust::Silent
        } else {
            Trust::Live { age }
        }
    }

    /// The fleet-wide index this instance's blocks are recorded in.
    pub fn fleet(&self) -> &Arc<FleetHeld> {
        &self.hot.fleet
    }

    /// This instance's slot in [`Feed::fleet`] (`None`: it was full).
    pub fn slot(&self) -> Option<u32> {
        self.hot.slot
    }

    /// Stop expecting prompts older than `silence`, if there are any: one
    /// atomic read otherwise (a view calls it for every live instance
    /// before its walk, as `matched` does under its lock).
    pub fn expire_due(&self, now: Instant) {
        self.expire_due_at(now, clock::stamp(now));
    }

    /// [`Feed::expire_due`] with `now` also as [`clock::stamp`] gives it.
    pub fn expire_due_at(&self, now: Instant, now_ns: u64) {
        if self
            .hot
            .oldest_expected
            .age_ns(now_ns)
            .is_some_and(|a| a >= self.silence_ns())
        {
            let mut st = self.lock();
            expire(&mut st, now, self.silence());
            self.hot
                .oldest_expected
                .set(st.expecting.front().map(|(t, _)| *t));
        }
    }

    pub fn held_blocks(&self) -> usize {
        self.hot.held.load(Ordering::Relaxed)
    }

    /// How much of `keys` this instance alone holds (a view walks the
    /// fleet-wide index once for every instance instead).
    pub fn matched(&self, keys: &[u64], shared: Option<&Feed>, w: TierWeights) -> Held {
        let now = Instant::now();
        let silence = self.silence();
        let stale = |st: &State| {
            st.expecting
                .front()
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= silence)
        };
        let mut st = self.read();
        if stale(&st) {
            drop(st);
            self.expire_due(now);
            st = self.read();
        }
        match shared {
            // Two locks, always this one first, and the shared feed never
            // takes an instance's: no cycle.
            Some(s) if !std::ptr::eq(s, self) => {
                let sh = s.read();
                st.index.matched(keys, Some(&sh.index), w)
            }
            _ => st.index.matched(keys, None, w),
        }
    }

    /// The gateway sent this instance a prompt: `scoped_root` is its first
    /// block's content key and scope when not the default and the instance
    /// does not hold that block; `new_blocks` whether it should store blocks
    /// it does not hold yet. The first sender of a root owns it until its
    /// event arrives or `silence` passes. Returns the time it now awaits a
    /// batch from, if this request started the wait (to [`Feed::withdraw`]).
    /// Its `keys` count as held until their events come (at most `silence`).
    pub fn dispatched(
        &self,
        keys: &std::sync::Arc<[u64]>,
        scoped_root: Option<&(u64, Scope)>,
        new_blocks: bool,
        now: Instant,
    ) -> Option<Instant> {
        let mut st = self.lock();
        expire(&mut st, now, self.silence());
        st.index.expect(keys);
        st.expecting.push_back((now, std::sync::Arc::clone(keys)));
        self.hot
            .oldest_expected
            .set(st.expecting.front().map(|(t, _)| *t));
        if let Some((root, scope)) = scoped_root {
            let fresh = st
                .pending
                .peek(root)
                .is_some_and(|(_, t)| now.saturating_duration_since(*t) < self.silence());
            if !fresh {
                st.pending.put(*root, (scope.clone(), now));
            }
        }
        drop(st);
        let connected = self.hot.connected.load(Ordering::Relaxed);
        (new_blocks && connected && self.hot.awaiting.set_if_none(now)).then_some(now)
    }

    /// The request that started the wait (`since`, if it did) and carried
    /// `keys` did no work (refused, failed): nothing is to be expected from it.
    pub fn withdraw(&self, since: Option<Instant>, keys: &std::sync::Arc<[u64]>) {
        if let Some(since) = since {
            self.hot.awaiting.clear_if(since);
        }
        let mut st = self.lock();
        if let Some(pos) = st
            .expecting
            .iter()
            .rposition(|(_, k)| std::sync::Arc::ptr_eq(k, keys))
            && let Some((_, k)) = st.expecting.remove(pos)
        {
            st.index.unexpect(&k);
        }
        self.hot
            .oldest_expected
            .set(st.expecting.front().map(|(t, _)| *t));
    }

    /// The subscription ended (the instance follows other sockets now, or
    /// none, or the gateway stops): no longer connected, and its blocks
    /// leave the fleet-wide index now, not when the last holder of the feed
    /// (an endpoint a reload replaced, still serving its requests) lets it
    /// go. Its metric series are the instance's, and left to its next feed.
    pub fn stop(&self) {
        self.set_connected(false);
        let mut st = self.lock();
        st.index.clear();
        self.held_now(&st);
    }

    /// Forget everything the publisher said: it restarted or cleared its
    /// cache, so the engine holds nothing and the index is complete again.
    pub fn reset(&self) {
        {
            let mut st = self.lock();
            st.index.clear();
            self.held_now(&st);
            self.hot.partial_since.set(None);
        }
        self.emptied();
    }

    /// Count a reset of the index, now empty.
    fn emptied(&self) {
        self.sequence("reset");
        self.series.held.set(0.0);
    }

    /// Start over from an empty index (first contact, a reconnection) and
    /// route the instance as unknown until the catch-up ends; an index that
    /// held blocks counts as reset.
    pub fn start_over(&self) {
        self.catching_up(true);
        let held = {
            let mut st = self.lock();
            let held = st.index.len();
            st.index.clear();
            self.held_now(&st);
            self.hot.partial_since.set(None);
            held
        };
        if held > 0 {
            self.emptied();
        }
    }

    /// A catch-up began (`true`) or ended.
    pub fn catching_up(&self, on: bool) {
        self.hot.replaying.store(on, Ordering::Release);
    }

    /// A batch read off the socket and not applied.
    pub fn shed(&self) {
        self.counters.shed.fetch_add(1, Ordering::Relaxed);
        self.series.shed.increment(1);
    }

    /// The index missed part of the history: from now it is partial
    /// (`clear`: and what it held can no longer be trusted either).
    pub fn partial(&self, clear: bool, now: Instant) {
        if clear {
            let mut st = self.lock();
            st.index.clear();
            self.held_now(&st);
        }
        self.hot.partial_since.set(Some(now));
        if clear {
            self.emptied();
        }
        tracing::warn!(endpoint = %self.labels.0, instance = %self.labels.1, "KV event history incomplete; approximate index until it is whole again");
    }

    /// Count a gap, a replay or (anything else) a reset.
    pub fn sequence(&self, what: &'static str) {
        let counter = match what {
            "gap" => &self.counters.gaps,
            "replay" => &self.counters.replays,
            _ => &self.counters.resets,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        telemetry::kv_sequence(&self.labels.0, &self.labels.1, what);
    }

    /// A message that could not be read at all.
    pub fn malformed(&self) {
        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        self.series.dropped.increment(1);
    }

    /// Decode and apply one batch's payload.
    pub fn apply_payload(&self, payload: &[u8]) {
        match super::wire::decode(payload) {
            Ok(batch) => self.apply(&batch, Instant::now()),
            Err(e) => {
                tracing::warn!(events = %self.events_url, error = %e, "undecodable KV event batch");
                self.malformed();
            }
        }
    }

    pub fn apply(&self, batch: &Batch, now: Instant) {
        let mut st = self.lock();
        expire(&mut st, now, self.silence());
        self.hot
            .oldest_expected
            .set(st.expecting.front().map(|(t, _)| *t));
        self.hot.last_batch.set(Some(now));
        self.hot.awaiting.set(None);
        let c = &self.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        let (mut applied, mut dropped, mut cleared) = (0u64, 0u64, false);
        for ev in &batch.events {
            match ev {
                Event::Stored {
                    hashes,
                    parent,
                    token_ids,
                    block_size,
                    lora,
                    medium,
                    salt,
                } => {
                    if *lora {
                        // Adapter blocks never match a base-model request.
                        dropped += hashes.len() as u64;
                        continue;
                    }
                    if *block_size != self.block_size {
                        // Keys of other-sized blocks never equal a request's:
                        // a misconfiguration to name, not to route on.
                        if !self.warned_block_size.swap(true, Ordering::Relaxed) {
                            tracing::error!(endpoint = %self.labels.0, instance = %self.labels.1, reported = *block_size, configured = self.block_size, "KV events report another block size than routing.block_size; set it to vLLM's --block-size");
                        }
                        dropped += hashes.len() as u64;
                        continue;
                    }
                    let root_seed = if parent.is_none() {
                        let first = token_ids.get(..*block_size).unwrap_or_default();
                        let silence = self.silence();
                        let sent = st
                            .pending
                            .pop(&held::root_content_key(first))
                            .filter(|(_, t)| now.saturating_duration_since(*t) < silence)
                            .map(|(scope, _)| scope);
                        let scope = match (salt, sent) {
                            // The engine says which salt; the partition is the
                            // gateway's, if it sent this prompt under that salt.
                            (Some(reported), sent) => Scope {
                                partition: sent
                                    .filter(|s| s.salt == *reported)
                                    .map(|s| s.partition)
                                    .unwrap_or_default(),
                                salt: reported.clone(),
                            },
                            (None, Some(sent)) => sent,
                            (None, None) => Scope::default(),
                        };
                        scope.seed()
                    } else {
                        0
                    };
                    let a =
                        st.index
                            .store(hashes, *parent, token_ids, *block_size, *medium, root_seed);
                    applied += a.stored as u64;
                    dropped += a.dropped as u64;
                    if a.orphaned > 0 {
                        self.hot.last_orphan.set(Some(now));
                    }
                }
                Event::Removed { hashes, medium } => {
                    applied += st.index.remove(hashes, *medium) as u64;
                }
                Event::Cleared => {
                    st.index.clear();
                    cleared = true;
                }
                Event::Unknown => dropped += 1,
            }
        }
        let held = self.held_now(&st);
        drop(st);
        c.applied.fetch_add(applied, Ordering::Relaxed);
        c.dropped.fetch_add(dropped, Ordering::Relaxed);
        self.series.applied.increment(applied);
        if dropped > 0 {
            self.series.dropped.increment(dropped);
        }
        self.series.held.set(held as f64);
        if cleared {
            self.sequence("reset");
        }
    }
}

/// Stop expecting prompts sent longer than `ttl` ago.
fn expire(st: &mut State, now: Instant, ttl: Duration) {
    while st
        .expecting
        .front()
        .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= ttl)
    {
        if let Some((_, keys)) = st.expecting.pop_front() {
            st.index.unexpect(&keys);
        }
    }
}

#[cfg(test)]
#[path = "feed_tests.rs"]
mod tests;
