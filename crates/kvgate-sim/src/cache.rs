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
            }
        }
        self.private += private;
        Some(hit)
    }

    /// Record that a sequence has computed block `hash`: from now on it serves hits.
    pub fn mark_computed(&mut self, hash: u64) {
        if let Some(b) = self.blocks.get_mut(&hash) {
            b.computed = true;
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
mod tests {
    use super::*;

    fn ids(range: std::ops::Range<u64>) -> Vec<u64> {
        range.collect()
    }

    fn computed(cache: &mut KvCache, hashes: &[u64]) {
        hashes.iter().for_each(|&h| cache.mark_computed(h));
    }

    #[test]
    fn shared_prefix_hits_only_computed_leading_blocks() {
        let mut c = KvCache::new(100);
        let a = ids(0..10);
        assert_eq!(c.try_acquire(&a, 1, usize::MAX), Some(0));
        // Not computed yet: a concurrent request sharing the prefix gets no hit.
        assert_eq!(c.try_acquire(&a, 0, usize::MAX), Some(0));
        computed(&mut c, &a[..6]);
        let b: Vec<u64> = a[..8].iter().copied().chain(100..104).collect();
        assert_eq!(c.try_acquire(&b, 0, usize::MAX), Some(6));
        assert_eq!(c.try_acquire(&b, 0, 3), Some(3), "max_hit caps the hit");
        assert_eq!(c.occupied(), 10 + 4 + 1);
    }

    #[test]
    fn released_blocks_stay_cached_until_evicted_lru_first() {
        let mut c = KvCache::new(20);
        let a = ids(0..10);
        c.try_acquire(&a, 0, usize::MAX).unwrap();
        computed(&mut c, &a);
        c.release(&a, 0);
        assert_eq!(c.in_use(), 0);
        assert_eq!(c.try_acquire(&a, 0, usize::MAX), Some(10));
        c.release(&a, 0);
        // 15 new blocks need 5 of the 10 cached ones: the tail goes first.
        let b = ids(100..115);
        assert_eq!(c.try_acquire(&b, 0, usize::MAX), Some(0));
        assert!((0..5).all(|h| c.contains(h)));
        assert!((5..10).all(|h| !c.contains(h)));
        assert_eq!(c.occupied(), 20);
        // The prefix whose tail was evicted now only partly hits.
        c.release(&b, 0);
        assert_eq!(c.try_acquire(&a, 0, usize::MAX), Some(5));
    }

    #[test]
    fn miss_after_eviction_in_a_tiny_cache() {
        let mut c = KvCache::new(4);
        let a = ids(0..4);
        c.try_acquire(&a, 0, usize::MAX).unwrap();
        computed(&mut c, &a);
        c.release(&a, 0);
        let b = ids(10..14);
        c.try_acquire(&b, 0, usize::MAX).unwrap();
        c.release(&b, 0);
        assert_eq!(c.try_acquire(&a, 0, usize::MAX), Some(0));
    }

    #[test]
    fn referenced_blocks_are_never_evicted() {
        let mut c = KvCache::new(10);
        let held = ids(0..6);
        c.try_acquire(&held, 0, usize::MAX).unwrap();
        computed(&mut c, &held);
        // 5 more do not fit while the 6 are held: refuse rather than evict them.
        assert_eq!(c.try_acquire(&ids(10..15), 0, usize::MAX), None);
        assert_eq!(c.try_acquire(&ids(10..12), 3, usize::MAX), None);
        assert!(held.iter().all(|&h| c.contains(h)));
        assert_eq!(c.occupied(), 6, "a refused admission changes nothing");
        assert_eq!(c.try_acquire(&ids(10..14), 0, usize::MAX), Some(0));
        c.release(&held, 0);
        assert_eq!(c.try_acquire(&ids(20..26), 0, usize::MAX), Some(0));
        assert!(held.iter().all(|&h| !c.contains(h)));
    }

    #[test]
    fn reusing_an_idle_block_does_not_count_it_as_evictable() {
        let mut c = KvCache::new(4);
        let a = ids(0..4);
        c.try_acquire(&a, 0, usize::MAX).unwrap();
        computed(&mut c, &a);
        c.release(&a, 0);
        // Reuses blocks 0..4 and needs 1 private block: nothing left to evict.
        assert_eq!(c.try_acquire(&a, 1, usize::MAX), None);
        assert_eq!(c.try_acquire(&a[..3], 1, usize::MAX), Some(3));
        assert_eq!(c.occupied(), 4);
        assert_eq!(c.in_use(), 4);
    }

    #[test]
    fn uncomputed_blocks_are_dropped_on_release() {
        let mut c = KvCache::new(10);
        let a = ids(0..5);
        c.try_acquire(&a, 2, usize::MAX).unwrap();
        computed(&mut c, &a[..2]);
        c.release(&a, 2);
        assert_eq!(c.occupied(), 2);
        assert_eq!(c.in_use(), 0);
    }
}
