//! Unit tests of the KV block cache: sharing, LRU eviction, refusal, events.

use super::*;

fn ids(range: std::ops::Range<u64>) -> Vec<u64> {
    range.collect()
}

fn computed(cache: &mut KvCache, hashes: &[u64]) {
    for &h in hashes {
        assert!(cache.mark_computed(h), "block {h} computed twice");
    }
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

#[test]
fn evictions_are_recorded_in_order_and_forget_reports_nothing() {
    let mut c = KvCache::new(4);
    c.try_acquire(&ids(0..4), 0, usize::MAX).unwrap();
    assert!(c.mark_computed(0));
    assert!(!c.mark_computed(0), "already computed");
    assert!(!c.mark_computed(99), "not in the cache");
    computed(&mut c, &ids(1..4));
    c.release(&ids(0..4), 0);
    c.try_acquire(&ids(10..12), 0, usize::MAX).unwrap();
    assert!(c.take_evicted().is_empty(), "not recording yet");
    c.record_evictions();
    c.try_acquire(&ids(20..22), 0, usize::MAX).unwrap();
    assert_eq!(c.take_evicted(), vec![1, 0], "tail first");
    assert!(c.take_evicted().is_empty());
    computed(&mut c, &ids(10..12));
    c.release(&ids(10..12), 0);
    c.forget_cached();
    assert!(c.take_evicted().is_empty());
    assert!(!c.contains(10) && !c.contains(20));
    assert_eq!(c.occupied(), 2, "the running sequence keeps its blocks");
    c.release(&ids(20..22), 0);
    assert_eq!(c.occupied(), 0, "uncomputed now, so dropped on release");
}
