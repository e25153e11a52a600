//! One upstream instance: its identity, in-flight count and cool-down.
//!
//! The in-flight count rises in [`Instance::claim`] and falls when the
//! returned [`InflightGuard`] drops — which the response body does when it
//! ends, errors, times out or is dropped by a departing client. RAII makes a
//! leak impossible short of leaking the guard itself.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::routing::Load;
use crate::telemetry;

#[derive(Debug)]
pub struct Instance {
    pub endpoint: String,
    pub id: String,
    pub url: String,
    in_flight: AtomicUsize,
    /// Milliseconds since [`epoch`] until which the instance is skipped.
    cooldown_until: AtomicU64,
    /// Set by health checks; starts healthy so a new fleet serves at once.
    healthy: AtomicBool,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Instance {
    pub fn new(endpoint: &str, id: &str, url: &str) -> Arc<Self> {
        telemetry::healthy(endpoint, id, true);
        telemetry::in_flight(endpoint, id, 0);
        Arc::new(Self {
            endpoint: endpoint.to_owned(),
            id: id.to_owned(),
            url: url.to_owned(),
            in_flight: AtomicUsize::new(0),
            cooldown_until: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
        })
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Healthy and not cooling down.
    pub fn available(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
            && self.cooldown_until.load(Ordering::Relaxed) <= now_ms()
    }

    pub fn load(&self) -> Load {
        Load {
            in_flight: self.in_flight(),
            available: self.available(),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
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

    /// Count one more request in flight until the guard drops.
    pub fn claim(self: &Arc<Self>) -> InflightGuard {
        let n = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        telemetry::in_flight(&self.endpoint, &self.id, n);
        InflightGuard {
            instance: Arc::clone(self),
        }
    }
}

/// One in-flight slot on an instance, released on drop.
#[derive(Debug)]
pub struct InflightGuard {
    instance: Arc<Instance>,
}

impl InflightGuard {
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let prev = self.instance.in_flight.fetch_sub(1, Ordering::Relaxed);
        telemetry::in_flight(
            &self.instance.endpoint,
            &self.instance.id,
            prev.saturating_sub(1),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_and_releases() {
        let i = Instance::new("e", "a", "http://a");
        let g1 = i.claim();
        let g2 = i.claim();
        assert_eq!(i.in_flight(), 2);
        drop(g1);
        assert_eq!(i.in_flight(), 1);
        drop(g2);
        assert_eq!(i.in_flight(), 0);
    }

    #[test]
    fn cool_down_makes_unavailable() {
        let i = Instance::new("e", "a", "http://a");
        assert!(i.available());
        i.cool_down(Duration::from_secs(60));
        assert!(!i.available());
        assert!(i.is_healthy());
    }
}
