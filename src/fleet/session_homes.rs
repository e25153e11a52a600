//! Where each hinted session (a Messages `metadata.user_id`) was last
//! served, so that a session's later first turns — a sub-agent, a new task
//! in the same session, a retry — go back to it instead of being placed as a
//! new session by count ([`kvgate_routing::Load::hosts_session`]).
//!
//! A bounded LRU (the `lru` crate) of the session's routing key to the
//! instance (weakly: a removed instance is no one's home), with an idle
//! expiry; one per endpoint, kept across reloads. Not shared between
//! replicas: a first turn that reaches a replica that has not served the
//! session is placed by count, and its later turns follow the history the
//! cache holds.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::Instance;

/// Sessions remembered at most: 65,536 × ~100 bytes.
const CAPACITY: usize = 65_536;
/// A session not served for this long is placed afresh: its history has
/// most likely left the instance's cache by then.
pub const IDLE_MS: u64 = 30 * 60 * 1000;

#[derive(Debug)]
pub struct SessionHomes {
    homes: Mutex<lru::LruCache<u64, (Weak<Instance>, u64)>>,
}

impl Default for SessionHomes {
    fn default() -> Self {
        Self {
            homes: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(CAPACITY).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }
}

impl SessionHomes {
    /// The instance that last served session `key`, if within [`IDLE_MS`]
    /// of `now_ms`.
    pub fn get(&self, key: u64, now_ms: u64) -> Option<Arc<Instance>> {
        let mut homes = self.homes.lock().unwrap_or_else(PoisonError::into_inner);
        match homes.get(&key) {
            Some((home, at)) if now_ms.saturating_sub(*at) < IDLE_MS => home.upgrade(),
            Some(_) => {
                homes.pop(&key);
                None
            }
            None => None,
        }
    }

    /// Session `key` was served by `instance` at `now_ms`.
    pub fn set(&self, key: u64, instance: &Arc<Instance>, now_ms: u64) {
        let mut homes = self.homes.lock().unwrap_or_else(PoisonError::into_inner);
        homes.put(key, (Arc::downgrade(instance), now_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_remembered_where_last_served_until_idle() {
        let homes = SessionHomes::default();
        let a = Instance::new("e", "a", "http://127.0.0.1:1");
        let b = Instance::new("e", "b", "http://127.0.0.1:2");
        let id = |i: Option<Arc<Instance>>| i.map(|i| i.id.clone());
        assert_eq!(id(homes.get(7, 0)), None);
        homes.set(7, &a, 0);
        assert_eq!(id(homes.get(7, 1_000)).as_deref(), Some("a"));
        homes.set(7, &b, 2_000);
        assert_eq!(id(homes.get(7, 2_000 + IDLE_MS - 1)).as_deref(), Some("b"));
        assert_eq!(id(homes.get(7, 2_000 + IDLE_MS)), None);
        assert_eq!(id(homes.get(7, 0)), None, "an expired session is forgotten");
        homes.set(8, &a, 0);
        drop(a);
        assert_eq!(id(homes.get(8, 1)), None, "a removed instance is no home");
    }
}
