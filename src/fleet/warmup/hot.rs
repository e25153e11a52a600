//! An endpoint's hottest prefixes: the routing keys seen most often lately,
//! each with the last forwarded body that carried it, so a joining instance
//! can be sent them before it takes traffic.
//!
//! Space-saving counting (Metwally et al.): at most `capacity` keys are
//! tracked; a new key replaces the least counted one and inherits its count,
//! which over-counts newcomers by at most that minimum but never loses a key
//! hotter than it. One mutex, taken once per request for a few hundred ns.
//! Bodies are the bytes that went upstream (tenant salt included, so a
//! warmed block is the tenant's own) and are kept only below `MAX_BODY`.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;

/// Bodies above this are not kept for warm-up.
pub const MAX_BODY: usize = 256 * 1024;
/// Keys tracked per endpoint.
const CAPACITY: usize = 256;

/// One hot prefix: where to send it and what.
#[derive(Debug, Clone)]
pub struct Hot {
    pub path: &'static str,
    pub body: Bytes,
    /// The approximate index chain the request had (cache-aware strategies).
    pub chain: std::sync::Arc<[u64]>,
    pub count: u64,
}

#[derive(Debug, Default)]
pub struct HotPrefixes {
    inner: Mutex<HashMap<u64, Hot>>,
}

impl HotPrefixes {
    /// Count one request with routing key `key`.
    pub fn record(
        &self,
        key: u64,
        path: &'static str,
        body: &Bytes,
        chain: &std::sync::Arc<[u64]>,
    ) {
        if body.len() > MAX_BODY {
            return;
        }
        let mut map = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(h) = map.get_mut(&key) {
            h.count += 1;
            h.body = body.clone();
            return;
        }
        let mut count = 1;
        if map.len() >= CAPACITY
            && let Some((&coldest, h)) = map.iter().min_by_key(|(_, h)| h.count)
        {
            count += h.count;
            map.remove(&coldest);
        }
        map.insert(
            key,
            Hot {
                path,
                body: body.clone(),
                chain: std::sync::Arc::clone(chain),
                count,
            },
        );
    }

    /// The `n` most counted prefixes, hottest first.
    pub fn top(&self, n: usize) -> Vec<Hot> {
        let map = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all: Vec<&Hot> = map.values().collect();
        all.sort_by_key(|h| std::cmp::Reverse(h.count));
        all.into_iter().take(n).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hottest_keys_survive_a_stream_of_one_off_keys() {
        let hot = HotPrefixes::default();
        let chain: std::sync::Arc<[u64]> = std::sync::Arc::new([]);
        let body = Bytes::from_static(b"{}");
        for round in 0..2000u64 {
            hot.record(round % 3, "/p", &body, &chain);
            hot.record(1_000 + round, "/p", &body, &chain);
        }
        let top: Vec<u64> = hot.top(3).iter().map(|h| h.count).collect();
        assert!(top.iter().all(|&c| c >= 600), "{top:?}");
        assert!(hot.top(1000).len() <= CAPACITY);
        hot.record(5, "/p", &Bytes::from(vec![b' '; MAX_BODY + 1]), &chain);
        assert!(hot.top(1000).iter().all(|h| h.body.len() <= MAX_BODY));
    }
}
