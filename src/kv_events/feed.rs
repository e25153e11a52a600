//! One publisher's view: the [`HeldIndex`] its events build, whether they can
//! be trusted right now, and the counts `explain` and `/metrics` show. The
//! subscriber task writes it; request routing reads it.
//!
//! Trust: events are used while the subscription is connected and the
//! publisher is not *silent*. vLLM sends nothing when idle, so silence alone
//! means nothing; silence after the gateway sent the instance a prompt that
//! must store new blocks does. Once such a request is older than `silence`
//! with no batch since, the instance falls back to the approximate index
//! until events flow again.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::wire::{Batch, Event};
use crate::routing::held::{self, Held, HeldIndex, Scope, TierWeights};
use crate::telemetry;

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
}

#[derive(Debug)]
struct State {
    index: HeldIndex,
    pending: lru::LruCache<u64, Scope>,
    last_batch: Option<Instant>,
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
    pub settings: FeedSettings,
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
            settings,
            state: Mutex::new(State {
                index: HeldIndex::new(settings.limit),
                pending: lru::LruCache::new(
                    std::num::NonZeroUsize::new(PENDING_SALTS)
                        .unwrap_or(std::num::NonZeroUsize::MIN),
                ),
                last_batch: None,
                awaiting: None,
            }),
        }
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
        let st = self.lock();
        let silent = st
            .awaiting
            .is_some_and(|t| now.saturating_duration_since(t) > self.settings.silence);
        let age = st.last_batch.map(|t| now.saturating_duration_since(t));
        drop(st);
        if self.was_silent.swap(silent, Ordering::Relaxed) != silent {
            if silent {
                tracing::warn!(endpoint = %self.labels.0, instance = %self.labels.1, events = %self.events_url, silence = ?self.settings.silence, "KV events went silent after requests that must store blocks; approximate index until they resume");
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
        let st = self.lock();
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
    /// block's content key and scope when not the default; `new_blocks`
    /// whether the instance should store blocks it does not hold yet. The
    /// first sender of a root owns it until its event arrives.
    pub fn dispatched(&self, scoped_root: Option<&(u64, Scope)>, new_blocks: bool, now: Instant) {
        let mut st = self.lock();
        if let Some((root, scope)) = scoped_root
            && !st.pending.contains(root)
        {
            st.pending.put(*root, scope.clone());
        }
        if new_blocks && st.awaiting.is_none() {
            st.awaiting = Some(now);
        }
    }

    /// Forget everything the publisher said (restart, AllBlocksCleared, a gap
    /// replay could not fill).
    pub fn reset(&self) {
        self.lock().index.clear();
        self.counters.resets.fetch_add(1, Ordering::Relaxed);
        self.sequence("reset");
        telemetry::kv_held(&self.labels.0, &self.labels.1, 0);
    }

    /// Count a gap, replay or reset.
    pub fn sequence(&self, what: &'static str) {
        let counter = match what {
            "gap" => &self.counters.gaps,
            "replay" => &self.counters.replays,
            _ => return telemetry::kv_sequence(&self.labels.0, &self.labels.1, what),
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
                    if *block_size != self.settings.block_size {
                        // Keys of other-sized blocks never equal a request's:
                        // a misconfiguration to name, not to route on.
                        if !self.warned_block_size.swap(true, Ordering::Relaxed) {
                            tracing::error!(endpoint = %self.labels.0, instance = %self.labels.1, reported = *block_size, configured = self.settings.block_size, "KV events report another block size than routing.block_size; set it to vLLM's --block-size");
                        }
                        dropped += hashes.len() as u64;
                        continue;
                    }
                    let root_seed = if parent.is_none() {
                        let first = token_ids.get(..*block_size).unwrap_or_default();
                        let sent = st.pending.pop(&held::root_content_key(first));
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
            c.resets.fetch_add(1, Ordering::Relaxed);
            telemetry::kv_sequence(ep, inst, "reset");
        }
    }
}
