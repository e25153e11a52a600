//! An `Option<Instant>` in an atomic, so that routing reads a feed's times
//! (its last batch, since when it is partial or awaited) without its lock.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The instant times count from: a second before first use, so that an
/// instant taken just before then still counts exactly.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(1)).unwrap_or(now)
    })
}

/// Nanoseconds since the epoch, plus one; 0 is `None`.
fn encode(t: Option<Instant>) -> u64 {
    t.map_or(0, |t| {
        let n = t.saturating_duration_since(epoch()).as_nanos();
        u64::try_from(n).unwrap_or(u64::MAX - 1) + 1
    })
}

/// `t` as an [`AtomicTime`] holds it, to compare with [`AtomicTime::age_ns`]:
/// a view of 1,000 feeds takes the clock's arithmetic once, not once a
/// field of each.
pub fn stamp(t: Instant) -> u64 {
    encode(Some(t))
}

#[derive(Debug, Default)]
pub struct AtomicTime(AtomicU64);

impl AtomicTime {
    /// How long before `now` ([`stamp`]) it is, in nanoseconds (0 when
    /// after it); `None` when unset.
    pub fn age_ns(&self, now: u64) -> Option<u64> {
        match self.0.load(Ordering::Acquire) {
            0 => None,
            n => Some(now.saturating_sub(n)),
        }
    }

    pub fn get(&self) -> Option<Instant> {
        match self.0.load(Ordering::Acquire) {
            0 => None,
            n => Some(epoch() + Duration::from_nanos(n - 1)),
        }
    }

    pub fn set(&self, t: Option<Instant>) {
        self.0.store(encode(t), Ordering::Release);
    }

    /// Set `t` if it holds nothing; whether it did.
    pub fn set_if_none(&self, t: Instant) -> bool {
        self.0
            .compare_exchange(0, encode(Some(t)), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Clear it if it still holds `t`.
    pub fn clear_if(&self, t: Instant) {
        let _ = self
            .0
            .compare_exchange(encode(Some(t)), 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_compares() {
        let t = AtomicTime::default();
        assert_eq!(t.get(), None);
        let now = Instant::now();
        assert!(t.set_if_none(now));
        assert!(!t.set_if_none(now + Duration::from_secs(1)));
        let got = t.get().unwrap_or(epoch());
        assert!(got <= now && now.duration_since(got) < Duration::from_micros(1));
        t.clear_if(now + Duration::from_secs(1));
        assert!(t.get().is_some());
        t.clear_if(now);
        assert_eq!(t.get(), None);
    }

    #[test]
    fn ages_count_from_a_stamp() {
        let t = AtomicTime::default();
        let now = Instant::now();
        assert_eq!(t.age_ns(stamp(now)), None);
        t.set(Some(now));
        assert_eq!(
            t.age_ns(stamp(now + Duration::from_millis(3))),
            Some(3_000_000)
        );
        assert_eq!(t.age_ns(stamp(now)), Some(0));
        assert_eq!(
            t.age_ns(stamp(
                now.checked_sub(Duration::from_millis(1)).unwrap_or(now)
            )),
            Some(0),
            "a time after now is no age"
        );
    }
}
