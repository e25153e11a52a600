//! A bounded LRU of text segment → token ids, keyed by the segment's xxh3-128.
//!
//! Segments are the pieces of a rendered prompt between special tokens; a long
//! system prompt repeated across requests is one segment, so a warm request
//! costs a hash of its text instead of a BPE pass. 128-bit keys make a wrong
//! hit (two segments with one key) practically impossible.
//!
//! Short segments are cached too: a chat template puts one between every two
//! messages (the "\n" after `<|im_end|>`), and a Hugging Face encode of even
//! one character costs microseconds (its normalizer, pre-tokenizer and
//! `Encoding` are built per call) against tens of nanoseconds for a hash and
//! a lookup: on a 100k-token agent prompt of ~300 messages, about a
//! millisecond (benches/kv_aware.rs, `kv_aware_parts_100k_tokens`).

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

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
