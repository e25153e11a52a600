//! A token bucket that can be settled after the fact, for tokens per minute.
//!
//! governor's GCRA (used for requests per minute) can neither refund cells nor
//! charge cells it has not admitted, and token quotas need both: a request is
//! charged an estimate up front and settled with the upstream's reported count
//! when the response ends. So the balance here may go negative — a tenant that
//! sent more than estimated is in debt and waits for the refill to cover it.
//!
//! Refill is continuous at `capacity / 60 s`. A request needs
//! `min(estimate, capacity)` in the bucket, so a prompt larger than a minute's
//! quota still gets through once the bucket is full (and then owes).

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct TokenBucket {
    capacity: f64,
    per_sec: f64,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `per_minute` tokens.
    pub fn per_minute(per_minute: u64, now: Instant) -> Self {
        let capacity = per_minute as f64;
        Self {
            capacity,
            per_sec: capacity / 60.0,
            state: Mutex::new(State {
                tokens: capacity,
                at: now,
            }),
        }
    }

    fn refilled(&self, now: Instant) -> std::sync::MutexGuard<'_, State> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let dt = now.saturating_duration_since(s.at).as_secs_f64();
        s.tokens = (s.tokens + dt * self.per_sec).min(self.capacity);
        s.at = s.at.max(now);
        s
    }

    /// Charge `n` tokens if the bucket holds `min(n, capacity)`; otherwise
    /// say how long until it will. `Ok` carries what is left afterwards.
    pub fn take(&self, n: u64, now: Instant) -> Result<u64, Duration> {
        let mut s = self.refilled(now);
        let need = (n as f64).min(self.capacity);
        if s.tokens + 1e-9 >= need {
            s.tokens -= n as f64;
            Ok(s.tokens.max(0.0) as u64)
        } else {
            Err(Duration::from_secs_f64((need - s.tokens) / self.per_sec))
        }
    }

    /// Replace a charge of `charged` with the true count `actual`: refund
    /// an over-estimate, or put an under-estimate on the tab.
    pub fn settle(&self, charged: u64, actual: u64, now: Instant) {
        let mut s = self.refilled(now);
        s.tokens = (s.tokens + charged as f64 - actual as f64).min(self.capacity);
    }

    pub fn capacity(&self) -> u64 {
        self.capacity as u64
    }

    /// Tokens available now (zero while in debt).
    #[cfg(test)]
    pub fn remaining(&self, now: Instant) -> u64 {
        self.refilled(now).tokens.max(0.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_refuses_and_refills() {
        let t0 = Instant::now();
        let b = TokenBucket::per_minute(600, t0);
        assert_eq!(b.take(500, t0), Ok(100));
        let wait = b.take(200, t0).unwrap_err();
        // 100 more tokens at 10/s.
        assert!((wait.as_secs_f64() - 10.0).abs() < 0.01, "{wait:?}");
        assert_eq!(b.take(200, t0 + Duration::from_secs(10)), Ok(0));
    }

    #[test]
    fn settle_refunds_and_charges_debt() {
        let t0 = Instant::now();
        let b = TokenBucket::per_minute(600, t0);
        b.take(500, t0).unwrap();
        b.settle(500, 10, t0);
        assert_eq!(b.remaining(t0), 590);
        b.take(10, t0).unwrap();
        b.settle(10, 2000, t0);
        // 580 - 1990 = -1410: in debt, needs 1410 + 10 at 10/s.
        assert_eq!(b.remaining(t0), 0);
        let wait = b.take(10, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 142.0).abs() < 0.01, "{wait:?}");
    }

    #[test]
    fn oversized_request_passes_a_full_bucket_once() {
        let t0 = Instant::now();
        let b = TokenBucket::per_minute(100, t0);
        assert_eq!(b.take(1000, t0), Ok(0));
        assert!(b.take(1, t0).is_err());
        // Never above capacity however long it idles.
        assert_eq!(b.remaining(t0 + Duration::from_secs(3600)), 100);
    }
}
