//! What one instance is believed to hold: the block-chain hashes the gateway
//! sent there, in LRU order, bounded by the instance's KV capacity.
//!
//! The model follows vLLM's prefix cache: blocks of a finished request stay
//! cached until the space is needed, least recently used first. A dispatch
//! touches its whole chain **deepest block first**, so a block's parent is
//! always at least as recent as the block; eviction then always takes a chain
//! from its tail and the held set stays *prefix-closed* (a held block's parent
//! is held). That is what lets [`BlockIndex::matched`] binary-search the chain:
//! O(log blocks) probes instead of one per block, and per request
//! O(instances × log blocks) in all.
//!
//! The capacity corrects itself ([`BlockIndex::calibrate`]): an engine's
//! answer says how many prompt tokens it had cached (`cached_tokens`). Fewer
//! than the index expected means the engine evicted blocks the index still
//! holds, so it is smaller than believed: the estimate drops to the reuse
//! distance of what was lost (blocks touched here since), at most halving at a
//! time. More than expected while the index is full means the estimate is too
//! small: it grows by a quarter, up to the configured or learned capacity.
//! Only answers whose matched blocks were *settled* count — computed by a
//! request that had already been answered — since a second request for a
//! prefix still being prefilled finds it only partly cached however large the
//! cache. This is what makes `longest_prefix` right on engines that export no
//! capacity (SGLang, llama.cpp, TGI), where it would otherwise believe the
//! 384,000-token default and route to holders that evicted long ago.
//!
//! Memory: at most `capacity` entries of [`ENTRY_BYTES`] each (measured in the
//! hot-path benchmark), so an instance modelled at 384k tokens with 64-token
//! blocks costs 6,000 entries ≈ 0.4 MB. One mutex per instance, held for a
//! lookup or an insert only: there is no lock shared by all instances.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use lru::LruCache;

/// Approximate heap bytes per entry: the LRU node (key, two links, allocator
/// header) and its hash-table slot. `benches/routing.rs` measures the real figure.
pub const ENTRY_BYTES: usize = 84;

/// The smallest capacity estimate calibration may reach, in blocks.
pub const MIN_BLOCKS: usize = 16;

/// The blocks one instance holds, as far as the gateway knows.
/// `cap` first (`repr(C)`): a view reads it beside the instance's load.
#[derive(Debug)]
#[repr(C)]
pub struct BlockIndex {
    /// The LRU's capacity, for readers that want only it: a view reads it
    /// of every instance, and the lock was a tenth of a 1,000-instance
    /// view. Written under the lock wherever the capacity changes.
    cap: AtomicUsize,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `None` when the endpoint's strategy keeps no index. Its `cap()` is the
    /// current capacity estimate.
    lru: Option<LruCache<u64, Touch>>,
    /// The configured or learned capacity: the estimate never grows past it.
    ceiling: usize,
    /// Blocks touched so far: the clock reuse distances are counted on.
    touches: u64,
    /// Inserts whose request has no answer yet (see [`BlockIndex::settle`]).
    pending: HashSet<u64>,
    /// The block size the hashes were cut with; a change makes them meaningless.
    block_bytes: usize,
    /// Inserts so far: a [`BlockIndex::forget`] is honoured only if no other
    /// insert came after its own, since taking blocks back from under a later
    /// request could break prefix closure (and remove what that request holds).
    inserts: u64,
}

/// What [`BlockIndex::lookup`] finds for a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lookup {
    pub matched: usize,
    pub fill: u16,
    pub prefilling: bool,
}

/// When a block was last touched (at which clock), and by which insert it
/// was computed.
#[derive(Debug, Clone, Copy)]
struct Touch {
    insert: u64,
    at: u64,
}

/// What an insert added, so a request that never reached the instance can be
/// taken back out ([`BlockIndex::forget`]), and what the answer is checked
/// against ([`BlockIndex::calibrate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inserted {
    /// Chain blocks `[from..to]` were new to the index.
    pub from: usize,
    pub to: usize,
    /// Blocks the index holds after the insert.
    pub len: usize,
    /// Blocks touched here since the deepest matched block was last touched,
    /// when a request already answered had touched it (else `None`).
    pub reuse: Option<u64>,
    /// Which insert this was.
    stamp: u64,
}

impl Inserted {
    /// Which insert this was, for [`BlockIndex::settle`].
    pub fn stamp(&self) -> u64 {
        self.stamp
    }
}

impl Default for BlockIndex {
    fn default() -> Self {
        Self::new(0, 0)
    }
}

impl BlockIndex {
    /// An index of at most `capacity` blocks of `block_bytes`; 0 keeps none.
    pub fn new(capacity: usize, block_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                lru: NonZeroUsize::new(capacity).map(LruCache::new),
                ceiling: capacity,
                touches: 0,
                pending: HashSet::new(),
                block_bytes,
                inserts: 0,
            }),
            cap: AtomicUsize::new(capacity),
        }
    }

    /// Publish the capacity readers see without the lock.
    fn publish_cap(&self, inner: &Inner) {
        let cap = inner.lru.as_ref().map_or(0, |l| l.cap().get());
        self.cap.store(cap, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the LRU half-updated in
        // a way that matters for routing; keep serving rather than poison.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Apply new settings (a reload, a learned capacity): a different block
    /// size clears the index, a different capacity shrinks or grows it,
    /// evicting the oldest blocks, and starts the estimate over from it.
    pub fn configure(&self, capacity: usize, block_bytes: usize) {
        let mut inner = self.lock();
        inner.ceiling = capacity;
        if inner.block_bytes != block_bytes {
            inner.lru = None;
            inner.block_bytes = block_bytes;
        }
        match (NonZeroUsize::new(capacity), inner.lru.as_mut()) {
            (None, _) => inner.lru = None,
            (Some(cap), Some(lru)) => lru.resize(cap),
            (Some(cap), None) => inner.lru = Some(LruCache::new(cap)),
        }
        self.publish_cap(&inner);
    }

    /// How many leading blocks of `chain` the instance holds.
    pub fn matched(&self, chain: &[u64]) -> usize {
        let inner = self.lock();
        inner.lru.as_ref().map_or(0, |lru| matched_in(lru, chain))
    }

    /// Record that the instance is about to compute `chain` (and so will cache
    /// it): touch every block, deepest first, evicting the least recent.
    pub fn insert(&self, chain: &[u64]) -> Inserted {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.inserts += 1;
        let stamp = inner.inserts;
        let Some(lru) = inner.lru.as_mut() else {
            return Inserted::default();
        };
        let chain = &chain[..chain.len().min(lru.cap().get())];
        let from = matched_in(lru, chain);
        // The deepest matched block is the chain's least recent: its reuse
        // distance bounds what the engine must have kept for this to hit.
        let reuse = from
            .checked_sub(1)
            .and_then(|d| lru.peek(&chain[d]))
            .filter(|t| !inner.pending.contains(&t.insert))
            .map(|t| inner.touches - t.at);
        for (i, &h) in chain.iter().enumerate().rev() {
            inner.touches += 1;
            let at = inner.touches;
            // A block held already keeps the insert that computed it: a hit
            // on it is settled once that insert is.
            if i < from
                && let Some(t) = lru.get_mut(&h)
            {
                t.at = at;
                continue;
            }
            lru.put(h, Touch { insert: stamp, at });
        }
        inner.pending.insert(stamp);
        Inserted {
            from,
            to: chain.len(),
            len: lru.len(),
            reuse,
            stamp,
        }
    }

    /// The request of insert `stamp` has been answered (or gave up): the
    /// engine holds what it computed, and later hits on it are settled.
    pub fn settle(&self, stamp: u64) {
        self.lock().pending.remove(&stamp);
    }

    /// Correct the capacity estimate from an answer: the insert expected
    /// `inserted.from` blocks held, the engine reported `held` (its
    /// `cached_tokens` in index blocks). See the module docs.
    pub fn calibrate(&self, inserted: &Inserted, held: usize) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(lru) = inner.lru.as_mut() else {
            return;
        };
        let cap = lru.cap().get();
        let expected = inserted.from;
        let estimate = if expected >= 2 && held * 2 < expected {
            // A miss the engine's cache explains only by being smaller.
            let Some(reuse) = inserted.reuse else { return };
            let lost_at = usize::try_from(reuse).unwrap_or(usize::MAX);
            lost_at.max(cap / 2).max(MIN_BLOCKS).min(cap)
        } else if held > expected + 1 && lru.len() >= cap {
            // It kept what the index had already let go.
            cap.saturating_add(cap / 4 + 1).min(inner.ceiling)
        } else {
            return;
        };
        if let Some(n) = NonZeroUsize::new(estimate).filter(|n| n.get() != cap) {
            lru.resize(n);
            self.cap.store(n.get(), Ordering::Relaxed);
        }
    }

    /// Take back what [`insert`](Self::insert) added for a request that never
    /// reached the instance (connection refused, 502/503, a 4xx), unless
    /// another insert came since: then the blocks stay, over-counted until
    /// the LRU ages them out, which is harmless.
    pub fn forget(&self, chain: &[u64], inserted: Inserted) {
        let mut inner = self.lock();
        inner.pending.remove(&inserted.stamp);
        if inner.inserts != inserted.stamp {
            return;
        }
        if let Some(lru) = inner.lru.as_mut() {
            let added = chain.get(inserted.from..inserted.to).unwrap_or_default();
            for h in added.iter().rev() {
                lru.pop(h);
            }
        }
    }

    /// Blocks held now.
    pub fn len(&self) -> usize {
        self.lock().lru.as_ref().map_or(0, LruCache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most blocks it will hold (the current estimate).
    pub fn capacity(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// Whether what it holds fills (95% of) its capacity, so that anything
    /// new evicts something.
    pub fn is_full(&self) -> bool {
        self.lock().lru.as_ref().is_some_and(full)
    }

    /// [`matched`](Self::matched) and [`fill`](Self::fill) under one lock,
    /// and whether the deepest matched block is still being prefilled (the
    /// request that put it here has no answer yet: [`Load::prefilling`]).
    ///
    /// [`Load::prefilling`]: crate::Load::prefilling
    pub fn lookup(&self, chain: &[u64]) -> Lookup {
        let inner = self.lock();
        let Some(lru) = inner.lru.as_ref() else {
            return Lookup::default();
        };
        let matched = matched_in(lru, chain);
        let prefilling = matched
            .checked_sub(1)
            .and_then(|d| lru.peek(&chain[d]))
            .is_some_and(|t| inner.pending.contains(&t.insert));
        Lookup {
            matched,
            fill: fill_of(lru),
            prefilling,
        }
    }

    /// How full it is, in thousandths of its capacity ([`Load::cache_fill`]).
    pub fn fill(&self) -> u16 {
        self.lock().lru.as_ref().map_or(0, fill_of)
    }

    /// Forget everything (the instance restarted or reported a cleared cache).
    pub fn clear(&self) {
        if let Some(lru) = self.lock().lru.as_mut() {
            lru.clear();
        }
    }
}

fn full(lru: &LruCache<u64, Touch>) -> bool {
    super::cost::fills(lru.len(), lru.cap().get())
}

fn fill_of(lru: &LruCache<u64, Touch>) -> u16 {
    super::cost::fill(lru.len(), lru.cap().get())
}

/// Binary search for the first block not held: exact because the held set is
/// prefix-closed (see the module docs). The first block is probed alone
/// first: in a large fleet most instances hold none of a prompt, and one
/// probe (one cache miss) says so where the search would take log₂ blocks.
fn matched_in(lru: &LruCache<u64, Touch>, chain: &[u64]) -> usize {
    match chain.split_first() {
        Some((first, rest)) if lru.contains(first) => 1 + rest.partition_point(|h| lru.contains(h)),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| seed * 1_000_003 + i).collect()
    }

    #[test]
    fn matches_the_longest_held_prefix() {
        let idx = BlockIndex::new(100, 256);
        let a = chain(1, 10);
        idx.insert(&a[..6]);
        assert_eq!(idx.matched(&a), 6);
        assert_eq!(idx.matched(&chain(2, 10)), 0);
        let ins = idx.insert(&a);
        assert_eq!((ins.from, ins.to, ins.len), (6, 10, 10));
        assert_eq!(idx.matched(&a), 10);
    }

    #[test]
    fn a_match_is_prefilling_until_the_insert_that_computed_it_settles() {
        let idx = BlockIndex::new(100, 256);
        let a = chain(1, 10);
        let first = idx.insert(&a[..6]);
        let l = idx.lookup(&a);
        assert_eq!((l.matched, l.prefilling), (6, true));
        idx.settle(first.stamp());
        assert!(!idx.lookup(&a).prefilling);
        // A later request hitting those blocks does not make them pending
        // again; the blocks it adds are, until it settles.
        let second = idx.insert(&a[..6]);
        assert!(!idx.lookup(&a[..6]).prefilling);
        let third = idx.insert(&a);
        assert!(idx.lookup(&a).prefilling);
        assert!(!idx.lookup(&a[..6]).prefilling);
        idx.settle(third.stamp());
        idx.settle(second.stamp());
        assert_eq!(
            idx.lookup(&a),
            Lookup {
                matched: 10,
                fill: idx.fill(),
                prefilling: false
            }
        );
    }

    #[test]
    fn eviction_takes_old_chains_from_their_tails() {
        let idx = BlockIndex::new(10, 256);
        let old = chain(1, 8);
        idx.insert(&old);
        idx.insert(&chain(2, 4));
        // 12 blocks into 10: the old chain's two deepest blocks went.
        assert_eq!(idx.len(), 10);
        assert_eq!(idx.matched(&old), 6);
        // A chain longer than the cache keeps its head.
        idx.insert(&chain(3, 30));
        assert_eq!(idx.matched(&chain(3, 30)), 10);
        assert_eq!(idx.matched(&old), 0);
    }

    #[test]
    fn forget_undoes_only_what_the_insert_added() {
        let idx = BlockIndex::new(100, 256);
        let a = chain(1, 10);
        idx.insert(&a[..4]);
        let ins = idx.insert(&a);
        idx.forget(&a, ins);
        assert_eq!(idx.matched(&a), 4);
    }

    #[test]
    fn a_later_insert_makes_an_earlier_forget_a_no_op() {
        let idx = BlockIndex::new(100, 256);
        let c = chain(1, 8);
        idx.insert(&c[..2]);
        let a = idx.insert(&c[..6]);
        idx.insert(&c); // another request extends the chain on the same instance
        idx.forget(&c, a); // the first one's connection failed
        assert_eq!(
            idx.matched(&c),
            8,
            "closure kept, the later request's blocks kept"
        );
    }

    #[test]
    fn configure_resizes_and_a_new_block_size_clears() {
        let idx = BlockIndex::new(100, 256);
        idx.insert(&chain(1, 50));
        idx.configure(20, 256);
        assert_eq!((idx.len(), idx.matched(&chain(1, 50))), (20, 20));
        idx.configure(20, 128);
        assert!(idx.is_empty());
        idx.configure(0, 128);
        assert_eq!(idx.insert(&chain(1, 5)).len, 0);
        assert_eq!((idx.capacity(), idx.matched(&chain(1, 5))), (0, 0));
    }
}

#[cfg(test)]
#[path = "index_calibrate.rs"]
mod index_calibrate;

#[cfg(test)]
#[path = "index_props.rs"]
mod index_props;
