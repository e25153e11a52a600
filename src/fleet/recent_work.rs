//! A decaying count of the prefill work sent to an instance lately, which
//! cache-aware routing uses to break ties between equally cheap instances
//! (a cold prefix on an idle fleet) in favour of the one given least.
//!
//! It halves every [`HALF_LIFE_MS`], on boundaries every instance shares, so
//! comparisons between instances stay fair; lock-free, and cheap enough for
//! the request path (two relaxed loads when no boundary has passed).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How long work keeps half its weight.
pub const HALF_LIFE_MS: u64 = 10_000;

#[derive(Debug, Default)]
pub struct RecentWork {
    tokens: AtomicU64,
    /// The half-life period the count was last decayed into.
    period: AtomicU64,
}

impl RecentWork {
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
        let period = now_ms / HALF_LIFE_MS;
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
}
