//! Per-instance KV block cache: blocks keyed by chained hash, ref-counted by running
//! sequences, unreferenced blocks kept for reuse and evicted least recently used first.
//!
//! Capacity is counted in blocks. Besides the hashed (shareable) prompt blocks, a
//! sequence also holds private blocks for its trailing partial prompt block and its
//! output tokens; they count against capacity but are never shared or cached.
//! A block only serves hits once a sequence has computed it (`computed`), as in
//! vLLM, where a block is hashed into the cache when it fills. Costs: admission and
//! release are O(blocks of the request · log cache), eviction O(log cache).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Block hashes are already uniform 64-bit xxh3 values: hash them as themselves.
#[derive(Default)]
pub struct IdentityHasher(u64);

/// A `BuildHasher` for maps and sets keyed by block hashes.
pub type BlockHashBuilder = BuildHasherDefault<IdentityHasher>;

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-u64 keys, which this map never has; fold anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BlockMap = HashMap<u64, Block, BlockHashBuilder>;

#[derive(Debug)]
struct Block {
    refs: u32,
    computed: bool,
    /// Position in `lru` while `refs == 0`.
    lru_tick: u64,
}

#[derive(Debug)]
pub struct KvCache {
    capacity: usize,
    blocks: BlockMap,
    /// tick → hash of every computed block with `refs == 0`, oldest first.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    /// Private (unshareable) blocks held by running sequences.
    private: usize,
    /// Hashed blocks with `refs > 0`.
    referenced: usize,
    /// Hashes evicted since the last [`KvCache::take_evicted`], when recording.
    evicted: Option<Vec<u64>>,
}

impl KvCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            blocks: BlockMap::default(),
            lru: BTreeMap::new(),
            tick: 0,
            private: 0,
            referenced: 0,
            evicted: None,
        }
    }

    /// From now on, remember evicted hashes for [`KvCache::take_evicted`] (what a
    /// KV-event publisher reports as `BlockRemoved`).
    pub fn record_evictions(&mut self) {
        self.evicted.get_or_insert_with(Vec::new);
    }

    /// Hashes evicted since the last call, oldest first (empty unless recording).
    pub fn take_evicted(&mut self) -> Vec<u64> {
        self.evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Forget every cached block without reporting it, as a restarted instance
    /// does: idle blocks go, blocks held by running sequences stop serving hits
    /// and are dropped when released.
    pub fn forget_cached(&mut self) {
        for (_, h) in std::mem::take(&mut self.lru) {
            self.blocks.remove(&h);
        }
        self.blocks.values_mut().for_each(|b| b.computed = false);
        if let Some(evicted) = self.evicted.as_mut() {
            evicted.clear();
        }
    }

    /// Blocks held by running sequences (what vLLM reports as KV cache usage).
    pub fn in_use(&self) -> usize {
        self.referenced + self.private
    }

    /// Blocks occupied, whether in use or cached for reuse.
    pub fn occupied(&self) -> usize {
        self.blocks.len() + self.private
    }

    /// Whether `hash` is cached and computed (would serve a hit).
    #[cfg(test)]
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.blocks.get(&hash).is_some_and(|b| b.computed)
    }

    /// Reserve `hashes` (shared where present) and `private` blocks for a new
    /// sequence, evicting unreferenced blocks as needed. Returns the number of
    /// leading blocks that were already computed (the prefix hit), capped at
    /// `max_hit`, or `None`, changing nothing, when the blocks do not fit.
    pub fn try_acquire(&mut self, hashes: &[u64], private: usize, max_hit: usize) -> Option<usize> {
        let hit = hashes
            .iter()
            .take(max_hit)
            .take_while(|h| self.blocks.get(h).is_some_and(|b| b.computed))
            .count();
        let (mut missing, mut idle_reused) = (0usize, 0usize);
        for h in hashes {
            match self.blocks.get(h) {
                None => missing += 1,
                Some(b) if b.refs == 0 => idle_reused += 1,
                Some(_) => {}
            }
        }
        let need = missing + private;
        let free = self.capacity.saturating_sub(self.occupied());
        let evictable = self.lru.len().saturating_sub(idle_reused);
        if need > free + evictable {
            return None;
        }
        for &h in hashes {
            match self.blocks.entry(h) {
                Entry::Occupied(mut e) => {
                    let b = e.get_mut();
                    if b.refs == 0 {
                        self.lru.remove(&b.lru_tick);
                        self.referenced += 1;
                    }
                    b.refs = b.refs.saturating_add(1);
                }
                Entry::Vacant(e) => {
                    e.insert(Block {
                        refs: 1,
                        computed: false,
                        lru_tick: 0,
                    });
                    self.referenced += 1;
                }
            }
        }
        // The request's own blocks are referenced now, so eviction cannot take them.
        for _ in 0..need.saturating_sub(free) {
            if let Some((_, victim)) = self.lru.pop_first() {
                self.blocks.remove(&victim);
                if let Some(evicted) = self.evicted.as_mut() {
                    evicted.push(victim);
                }
            }
        }
        self.private += private;
        Some(hit)
    }

    /// Record that a sequence has computed block `hash`: from now on it serves hits.
    /// True when it was not computed before (it just became cached).
    pub fn mark_computed(&mut self, hash: u64) -> bool {
        match self.blocks.get_mut(&hash) {
            Some(b) => !std::mem::replace(&mut b.computed, true),
            None => false,
        }
    }

    /// Release a sequence's blocks. Computed blocks stay cached but evictable, the
    /// tail of the prompt first (as vLLM frees them in reverse, so a shared head
    /// outlives a private tail); blocks never computed are dropped.
    pub fn release(&mut self, hashes: &[u64], private: usize) {
        for &h in hashes.iter().rev() {
            let Entry::Occupied(mut e) = self.blocks.entry(h) else {
                continue;
            };
            let b = e.get_mut();
            if b.refs == 0 {
                continue;
            }
            b.refs -= 1;
            if b.refs > 0 {
                continue;
            }
            self.referenced = self.referenced.saturating_sub(1);
            if b.computed {
                self.tick += 1;
                b.lru_tick = self.tick;
                self.lru.insert(self.tick, h);
            } else {
                e.remove();
            }
        }
        self.private = self.private.saturating_sub(private);
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
