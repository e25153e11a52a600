//! A decaying count of what was sent to an instance lately: the prefill
//! work, which cache-aware routing uses to break ties between equally cheap
//! instances (a cold prefix on an idle fleet) in favour of the one given
//! least, and the conversations started there, by which a session's first
//! turn picks where it will live ([`kvgate_routing::Load::recent_sessions`]).
//!
//! It halves every half-life ([`HALF_LIFE_MS`] for work,
//! [`SESSION_HALF_LIFE_MS`] for sessions), on boundaries every instance
//! shares, so comparisons between instances stay fair; lock-free, and cheap
//! enough for the request path (two relaxed loads when no boundary has
//! passed).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How long work keeps half its weight.
pub const HALF_LIFE_MS: u64 = 10_000;

/// How long a conversation's start keeps half its weight: a session lives
/// for many turns, so its start counts for longer than its prefill.
pub const SESSION_HALF_LIFE_MS: u64 = 60_000;

#[derive(Debug)]
pub struct RecentWork {
    tokens: AtomicU64,
    /// The half-life period the count was last decayed into.
    period: AtomicU64,
    half_life_ms: u64,
}

impl Default for RecentWork {
    fn default() -> Self {
        Self::with_half_life(HALF_LIFE_MS)
    }
}

impl RecentWork {
    pub fn with_half_life(half_life_ms: u64) -> Self {
        Self {
            tokens: AtomicU64::new(0),
            period: AtomicU64::new(0),
            half_life_ms: half_life_ms.max(1),
        }
    }

    /// Add `tokens` of work at `now_ms`.
    pub fn add(&self, tokens: u64, now_ms: u64) {
        self.decay(now_ms);
        self.tokens.fetch_add(tokens, Relaxed);
    }

    /// The decayed count at `now_ms`.
    pub fn get(&self, now_ms: u64) -> u64 {
        self.decay(now_ms);
        self.tokens.load(Relaxed)
    }

    fn decay(&self, now_ms: u64) {
        let period = now_ms / self.half_life_ms;
        let last = self.period.load(Relaxed);
        // One caller wins the boundary and halves once per period passed.
        if period > last
            && self
                .period
                .compare_exchange(last, period, Relaxed, Relaxed)
                .is_ok()
        {
            let shift = u32::try_from(period - last).unwrap_or(63).min(63);
            let _ = self
                .tokens
                .fetch_update(Relaxed, Relaxed, |t| Some(t >> shift));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_halves_every_half_life() {
        let w = RecentWork::default();
        w.add(1000, 0);
        w.add(600, HALF_LIFE_MS - 1);
        assert_eq!(w.get(HALF_LIFE_MS - 1), 1600);
        assert_eq!(w.get(HALF_LIFE_MS), 800);
        assert_eq!(w.get(3 * HALF_LIFE_MS + 5), 200);
        assert_eq!(w.get(200 * HALF_LIFE_MS), 0);
    }

    #[test]
    fn each_counter_decays_at_its_own_half_life() {
        let s = RecentWork::with_half_life(SESSION_HALF_LIFE_MS);
        s.add(4, 0);
        assert_eq!(s.get(HALF_LIFE_MS), 4);
        assert_eq!(s.get(SESSION_HALF_LIFE_MS), 2);
        assert_eq!(s.get(3 * SESSION_HALF_LIFE_MS), 0);
    }
}
