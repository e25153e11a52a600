//! What the other replicas have dispatched to one instance, as of their last
//! shared reading: in flight, prefill still queued (tokens and requests),
//! recent work and conversations started. Written by the sync task, read on
//! every routing decision (relaxed atomics, no lock).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The other replicas' figures for one instance; all zero while alone.
#[derive(Debug, Default)]
pub struct PeerLoad {
    in_flight: AtomicU64,
    queued_prefill: AtomicU64,
    queued_requests: AtomicU64,
    recent_work: AtomicU64,
    recent_sessions: AtomicU64,
}

/// One replica's (or the sum of several replicas') figures for an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    pub in_flight: u64,
    pub queued_prefill: u64,
    /// Requests with no first byte yet; absent from an older replica's figures.
    #[serde(default)]
    pub queued_requests: u64,
    pub recent_work: u64,
    /// Conversations started lately; absent from an older replica's figures.
    #[serde(default)]
    pub recent_sessions: u64,
}

impl Figures {
    pub fn add(&mut self, other: &Figures) {
        self.in_flight = self.in_flight.saturating_add(other.in_flight);
        self.queued_prefill = self.queued_prefill.saturating_add(other.queued_prefill);
        self.queued_requests = self.queued_requests.saturating_add(other.queued_requests);
        self.recent_work = self.recent_work.saturating_add(other.recent_work);
        self.recent_sessions = self.recent_sessions.saturating_add(other.recent_sessions);
    }
}

impl PeerLoad {
    pub fn set(&self, f: Figures) {
        self.in_flight.store(f.in_flight, Relaxed);
        self.queued_prefill.store(f.queued_prefill, Relaxed);
        self.queued_requests.store(f.queued_requests, Relaxed);
        self.recent_work.store(f.recent_work, Relaxed);
        self.recent_sessions.store(f.recent_sessions, Relaxed);
    }

    pub fn get(&self) -> Figures {
        Figures {
            in_flight: self.in_flight.load(Relaxed),
            queued_prefill: self.queued_prefill.load(Relaxed),
            queued_requests: self.queued_requests.load(Relaxed),
            recent_work: self.recent_work.load(Relaxed),
            recent_sessions: self.recent_sessions.load(Relaxed),
        }
    }
}
