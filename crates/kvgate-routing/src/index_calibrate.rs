//! Tests of [`BlockIndex::calibrate`]: the capacity estimate follows what the
//! engine's answers say it kept.

use super::{BlockIndex, MIN_BLOCKS};

fn chain(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| seed * 1_000_003 + i).collect()
}

/// Insert and answer at once: every later hit on it is settled.
fn answered(idx: &BlockIndex, c: &[u64]) {
    let ins = idx.insert(c);
    idx.settle(ins.stamp());
}

#[test]
fn a_miss_shrinks_the_estimate_to_the_reuse_distance_at_most_halving() {
    let idx = BlockIndex::new(1000, 256);
    let doc = chain(1, 10);
    answered(&idx, &doc);
    for s in 2..70 {
        answered(&idx, &chain(s, 10));
    }
    // The doc's deepest block was touched first: its own 9 other blocks and
    // the 680 of the other chains came after.
    let again = idx.insert(&doc);
    assert_eq!((again.from, again.reuse), (10, Some(689)));
    // The engine had none of it: its cache is under 689 blocks.
    idx.calibrate(&again, 0);
    assert_eq!(idx.capacity(), 689);
    // Another miss at a short distance halves at most.
    idx.settle(again.stamp());
    let near = idx.insert(&doc);
    assert_eq!(near.reuse, Some(9));
    idx.calibrate(&near, 0);
    assert_eq!(idx.capacity(), 344);
}

#[test]
fn a_hit_as_expected_or_an_unsettled_miss_changes_nothing() {
    let idx = BlockIndex::new(1000, 256);
    let doc = chain(1, 10);
    let first = idx.insert(&doc);
    // A second request while the first is still being prefilled: the engine
    // has only part of it, however large its cache.
    let second = idx.insert(&doc);
    assert_eq!((second.from, second.reuse), (10, None));
    idx.calibrate(&second, 2);
    assert_eq!(idx.capacity(), 1000);
    idx.settle(first.stamp());
    idx.settle(second.stamp());
    let third = idx.insert(&doc);
    idx.calibrate(&third, 9); // the engine recomputes the last block: a hit
    assert_eq!(idx.capacity(), 1000);
}

#[test]
fn the_estimate_never_drops_below_the_floor_and_grows_back_to_the_ceiling() {
    let idx = BlockIndex::new(64, 256);
    let doc = chain(1, 4);
    for _ in 0..10 {
        answered(&idx, &doc);
        let again = idx.insert(&doc);
        idx.calibrate(&again, 0);
        idx.settle(again.stamp());
    }
    assert_eq!(idx.capacity(), MIN_BLOCKS);
    // Full, and the engine held more than the index still knew: grow.
    for s in 2..40 {
        answered(&idx, &chain(s, 4));
    }
    let old = chain(1, 4);
    let miss = idx.insert(&old);
    assert_eq!(miss.from, 0);
    idx.calibrate(&miss, 4);
    assert_eq!(idx.capacity(), MIN_BLOCKS + MIN_BLOCKS / 4 + 1);
    for _ in 0..20 {
        let m = idx.insert(&chain(99, 200));
        idx.calibrate(&m, 200);
        idx.settle(m.stamp());
    }
    assert_eq!(idx.capacity(), 64, "never past the configured capacity");
}

#[test]
fn fullness_is_what_makes_a_copy_displace() {
    let idx = BlockIndex::new(20, 256);
    answered(&idx, &chain(1, 10));
    assert!(!idx.is_full());
    answered(&idx, &chain(2, 10));
    assert!(idx.is_full());
}
