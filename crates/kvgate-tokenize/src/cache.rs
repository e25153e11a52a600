//! A bounded LRU of text segment → token ids, keyed by the segment's xxh3-128.
//!
//! Segments are the pieces of a rendered prompt between special tokens; a long
//! system prompt repeated across requests is one segment, so a warm request
//! costs a hash of its text instead of a BPE pass. 128-bit keys make a wrong
//! hit (two segments with one key) practically impossible.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

/// Segments shorter than this are encoded directly: hashing and locking
/// would cost about as much as the BPE pass.
pub(crate) const MIN_CACHED_LEN: usize = 16;

pub(crate) struct SegmentCache {
    map: Mutex<LruCache<u128, Arc<[u32]>>>,
}

impl SegmentCache {
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            map: Mutex::new(LruCache::new(capacity)),
        }
    }

    pub(crate) fn key(segment: &str) -> u128 {
        xxhash_rust::xxh3::xxh3_128(segment.as_bytes())
    }

    pub(crate) fn get(&self, key: u128) -> Option<Arc<[u32]>> {
        // A poisoned lock only means another thread panicked mid-update of
        // an LRU of pure data; its contents are still valid.
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key).cloned()
    }

    pub(crate) fn put(&self, key: u128, ids: Arc<[u32]>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.put(key, ids);
    }

    pub(crate) fn clear(&self) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
