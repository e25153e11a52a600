//! One publisher's view: the [`HeldIndex`] its events build, whether they can
//! be trusted right now, and the counts `explain` and `/metrics` show. The
//! subscriber task writes it; request routing reads it.
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
//! passed with no such orphaned block.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::wire::{Batch, Event};
use crate::telemetry;
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
    /// The last sequence number received, plus one (0: none yet).
    pub next_seq: AtomicU64,
}

#[derive(Debug)]
struct State {
    index: HeldIndex,
    /// Scope and send time of prompts whose first block the instance did not hold.
    pending: lru::LruCache<u64, (Scope, Instant)>,
    last_batch: Option<Instant>,
    /// Since when the index may lack blocks the engine holds.
    partial_since: Option<Instant>,
    /// Prompts expected (see `HeldIndex::expect`), oldest first, with when they were sent.
    expecting: std::collections::VecDeque<(Instant, std::sync::Arc<[u64]>)>,
    /// The last stored block dropped for an unknown parent.
    last_orphan: Option<Instant>,
    /// The oldest request sent since the last batch that should make the
    /// instance store blocks.
    awaiting: Option<Instant>,
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
    connected: AtomicBool,
    /// The last `trust` found it silent (to log the change once).
    was_silent: AtomicBool,
    /// A block size other than the endpoint's was reported (logged once).
    warned_block_size: AtomicBool,
    /// The endpoint's `block_size` (a change makes a new feed).
    pub block_size: usize,
    /// `silence`, in ms (reloads change it in place).
    silence_ms: AtomicU64,
    state: Mutex<State>,
}

impl Feed {
    pub fn new(
        (endpoint, instance): (&str, &str),
        events_url: &str,
        replay_url: Option<&str>,
        settings: FeedSettings,
    ) -> Self {
        Self {
            labels: (endpoint.to_owned(), instance.to_owned()),
            events_url: events_url.to_owned(),
            replay_url: replay_url.map(str::to_owned),
            counters: Counters::default(),
            connected: AtomicBool::new(false),
            was_silent: AtomicBool::new(false),
            warned_block_size: AtomicBool::new(false),
            block_size: settings.block_size,
            silence_ms: AtomicU64::new(
                u64::try_from(settings.silence.as_millis()).unwrap_or(u64::MAX),
            ),
            state: Mutex::new(State {
                index: HeldIndex::new(settings.limit),
                pending: lru::LruCache::new(
                    std::num::NonZeroUsize::new(PENDING_SALTS)
                        .unwrap_or(std::num::NonZeroUsize::MIN),
                ),
                last_batch: None,
                partial_since: None,
                expecting: std::collections::VecDeque::new(),
                last_orphan: None,
                awaiting: None,
            }),
        }
    }

    fn silence(&self) -> Duration {
        Duration::from_millis(self.silence_ms.load(Ordering::Relaxed))
    }

    /// Apply a reload's silence and limit (the block size cannot change in place).
    pub fn update(&self, settings: FeedSettings) {
        let ms = u64::try_from(settings.silence.as_millis()).unwrap_or(u64::MAX);
        self.silence_ms.store(ms, Ordering::Relaxed);
        self.lock().index.set_limit(settings.limit);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it cannot leave the index half-updated in a
        // way that matters for routing; keep serving.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set_connected(&self, up: bool) {
        self.connected.store(up, Ordering::Relaxed);
    }

    pub fn trust(&self, now: Instant) -> Trust {
        if !self.connected.load(Ordering::Relaxed) {
            return Trust::Disconnected;
        }
        let mut st = self.lock();
        let silence = self.silence();
        let within =
            |t: Option<Instant>| t.is_some_and(|t| now.saturating_duration_since(t) < silence);
        if st.partial_since.is_some() {
            if within(st.partial_since) || within(st.last_orphan) {
                return Trust::Partial;
            }
            st.partial_since = None;
            tracing::info!(endpoint = %self.labels.0, instance = %self.labels.1, "KV event index complete again");
        }
        let silent = st
            .awaiting
            .is_some_and(|t| now.saturating_duration_since(t) > silence);
        let age = st.last_batch.map(|t| now.saturating_duration_since(t));
        drop(st);
        if self.was_silent.swap(silent, Ordering::Relaxed) != silent {
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

    pub fn held_blocks(&self) -> usize {
        self.lock().index.len()
    }

    pub fn matched(&self, keys: &[u64], shared: Option<&Feed>, w: TierWeights) -> Held {
        let mut st = self.lock();
        if !st.expecting.is_empty() {
            expire(&mut st, Instant::now(), self.silence());
        }
        match shared {
            // Two locks, always this one first, and the shared feed never
            // takes an instance's: no cycle.
            Some(s) if !std::ptr::eq(s, self) => {
                let sh = s.lock();
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
        if let Some((root, scope)) = scoped_root {
            let fresh = st
                .pending
                .peek(root)
                .is_some_and(|(_, t)| now.saturating_duration_since(*t) < self.silence());
            if !fresh {
                st.pending.put(*root, (scope.clone(), now));
            }
        }
        let connected = self.connected.load(Ordering::Relaxed);
        if new_blocks && connected && st.awaiting.is_none() {
            st.awaiting = Some(now);
            return Some(now);
        }
        None
    }

    /// The request that started the wait (`since`, if it did) and carried
    /// `keys` did no work (refused, failed): nothing is to be expected from it.
    pub fn withdraw(&self, since: Option<Instant>, keys: &std::sync::Arc<[u64]>) {
        let mut st = self.lock();
        if since.is_some() && st.awaiting == since {
            st.awaiting = None;
        }
        if let Some(pos) = st
            .expecting
            .iter()
            .rposition(|(_, k)| std::sync::Arc::ptr_eq(k, keys))
            && let Some((_, k)) = st.expecting.remove(pos)
        {
            st.index.unexpect(&k);
        }
    }

    /// Forget everything the publisher said: it restarted or cleared its
    /// cache, so the engine holds nothing and the index is complete again.
    pub fn reset(&self) {
        {
            let mut st = self.lock();
            st.index.clear();
            st.partial_since = None;
        }
        self.emptied();
    }

    /// Count a reset of the index, now empty.
    fn emptied(&self) {
        self.sequence("reset");
        telemetry::kv_held(&self.labels.0, &self.labels.1, 0);
    }

    /// Start over from an empty index (first contact), counting nothing.
    pub fn start_over(&self) {
        let mut st = self.lock();
        st.index.clear();
        st.partial_since = None;
    }

    /// The index missed part of the history: from now it is partial
    /// (`clear`: and what it held can no longer be trusted either).
    pub fn partial(&self, clear: bool, now: Instant) {
        let mut st = self.lock();
        if clear {
            st.index.clear();
        }
        st.partial_since = Some(now);
        drop(st);
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
        telemetry::kv_events(&self.labels.0, &self.labels.1, 0, 1);
    }

    pub fn apply(&self, batch: &Batch, now: Instant) {
        let mut st = self.lock();
        expire(&mut st, now, self.silence());
        st.last_batch = Some(now);
        st.awaiting = None;
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
                        st.last_orphan = Some(now);
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
        let held = st.index.len();
        drop(st);
        c.applied.fetch_add(applied, Ordering::Relaxed);
        c.dropped.fetch_add(dropped, Ordering::Relaxed);
        let (ep, inst) = (&self.labels.0, &self.labels.1);
        telemetry::kv_events(ep, inst, applied, dropped);
        telemetry::kv_held(ep, inst, held);
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
