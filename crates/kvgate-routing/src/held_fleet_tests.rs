//! The fleet-wide index: one walk agrees with a walk an instance, shared
//! blocks are stored once, an instance's release drops only its holdings.
use std::collections::HashMap;

use super::fleet::FleetHeld;
use super::holders::{CPU, EXPECTED, GPU, REF};
use super::{Held, TierWeights};

const W: TierWeights = TierWeights { cpu: 0.5, l2: 0.25 };

/// The walk an instance, as `HeldIndex::matched` does it.
fn one(model: &HashMap<(u32, u64), u32>, slot: u32, keys: &[u64], shared: Option<u32>) -> Held {
    let mut out = Held::default();
    for &k in keys {
        let t = model.get(&(slot, k)).copied().unwrap_or(0);
        let l2 = shared.is_some_and(|s| model.get(&(s, k)).is_some_and(|t| t & (GPU | CPU) != 0));
        let weight = if t & GPU != 0 {
            out.gpu_blocks += 1;
            1.0
        } else if t & CPU != 0 {
            W.cpu
        } else if t & EXPECTED != 0 {
            1.0
        } else if l2 {
            W.l2
        } else {
            break;
        };
        out.blocks += 1;
        out.weighted += weight;
    }
    out
}

fn rng(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *x >> 33
}

#[test]
fn one_walk_for_the_fleet_equals_a_walk_an_instance() {
    let mut x = 7u64;
    for round in 0..200 {
        let fleet = FleetHeld::new();
        let n = 1 + (rng(&mut x) % 70) as u32;
        let slots: Vec<u32> = (0..n).filter_map(|_| fleet.join()).collect();
        let keys: Vec<u64> = (0..40).map(|i| 1000 + i).collect();
        let mut model = HashMap::new();
        for &s in &slots {
            // A prefix of the chain, with holes and mixed tiers.
            let len = rng(&mut x) % 41;
            for &k in &keys[..len as usize] {
                let t = match rng(&mut x) % 10 {
                    0 => continue,
                    1 => CPU,
                    2 => EXPECTED,
                    3 => GPU | CPU,
                    _ => GPU,
                };
                let refs = if t == EXPECTED { 0 } else { REF };
                fleet.upsert(k, s, |_| t | refs);
                model.insert((s, k), t);
            }
        }
        let shared = (round % 2 == 0).then(|| slots[0]);
        let got = fleet.matched_all(&keys, shared, W);
        for &s in slots.iter().filter(|&&s| Some(s) != shared) {
            let want = one(&model, s, &keys, shared);
            let h = got[s as usize];
            assert_eq!(
                (h.blocks, h.gpu_blocks),
                (want.blocks, want.gpu_blocks),
                "round {round} slot {s}"
            );
            assert!(
                (h.weighted - want.weighted).abs() < 1e-9,
                "round {round} slot {s}"
            );
        }
    }
}

#[test]
fn a_block_every_instance_holds_is_stored_once_and_release_drops_one_holder() {
    let fleet = FleetHeld::new();
    let slots: Vec<u32> = (0..300).filter_map(|_| fleet.join()).collect();
    let keys: Vec<u64> = (0..64).map(|i| i * 7919 + 1).collect();
    let mut at = HashMap::new();
    for &s in &slots {
        for &k in &keys {
            let (pos, _) = fleet.upsert(k, s, |r| (r + REF) | GPU).unwrap_or_default();
            at.entry(s).or_insert_with(Vec::new).push(pos);
        }
    }
    assert_eq!(fleet.len(), 64, "one entry a block, however many hold it");
    let all = fleet.matched_all(&keys, None, W);
    assert!(all.iter().all(|h| h.blocks == 64 && h.gpu_blocks == 64));
    // Instance 5 restarts: only its holdings go.
    let mut mine = at.remove(&5).unwrap_or_default();
    fleet.release(5, &mut mine);
    fleet.leave(5);
    let after = fleet.matched_all(&keys, None, W);
    assert_eq!(after[5].blocks, 0);
    assert!(
        after
            .iter()
            .enumerate()
            .all(|(s, h)| s == 5 || h.blocks == 64)
    );
    // Its slot is reused, empty.
    assert_eq!(fleet.join(), Some(5));
    assert_eq!(fleet.record(keys[0], 5), 0);
    for (s, mut p) in at {
        fleet.release(s, &mut p);
    }
    assert!(fleet.is_empty(), "entries without holders are freed");
}

#[test]
fn holders_spill_and_come_back_inline() {
    let fleet = FleetHeld::new();
    let (a, b) = (fleet.join().unwrap_or(0), fleet.join().unwrap_or(0));
    let (pa, _) = fleet.upsert(9, a, |_| REF | GPU).unwrap_or_default();
    let (pb, _) = fleet.upsert(9, b, |_| REF | CPU).unwrap_or_default();
    assert_eq!(pa, pb);
    assert_eq!(fleet.record(9, a) & (GPU | CPU), GPU);
    assert_eq!(fleet.record(9, b) & (GPU | CPU), CPU);
    assert_eq!(fleet.update(pa, a, |_| 0), 0);
    assert_eq!(fleet.record(9, a), 0);
    assert_eq!(fleet.key_at(pb), Some(9));
    fleet.update(pb, b, |_| 0);
    assert_eq!(fleet.key_at(pb), None);
    assert_eq!(
        fleet.update_key(9, a, |_| GPU),
        0,
        "no entry is made by update_key"
    );
    assert!(fleet.is_empty());
}

#[test]
fn entries_past_many_pages_keep_their_positions_and_are_reused() {
    // 200,000 blocks: about 3,000 a shard, over the 1,024 of a slab page.
    let fleet = FleetHeld::new();
    let s = fleet.join().unwrap_or(0);
    let keys: Vec<u64> = (0..200_000u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9))
        .collect();
    let pos: Vec<u32> = keys
        .iter()
        .map(|&k| {
            fleet
                .upsert(k, s, |_| REF | GPU)
                .map_or(u32::MAX, |(p, _)| p)
        })
        .collect();
    assert_eq!(fleet.len(), keys.len());
    for (&k, &p) in keys.iter().zip(&pos) {
        assert_eq!(fleet.key_at(p), Some(k));
    }
    // Every other block leaves; new blocks take their entries, the rest stay put.
    for &p in pos.iter().step_by(2) {
        fleet.update(p, s, |_| 0);
    }
    let fresh: Vec<u32> = (0..100_000u64)
        .map(|i| {
            fleet
                .upsert(u64::MAX - i, s, |_| REF | CPU)
                .map_or(u32::MAX, |(p, _)| p)
        })
        .collect();
    let freed: std::collections::HashSet<u32> = pos.iter().step_by(2).copied().collect();
    let reused = fresh.iter().filter(|p| freed.contains(p)).count();
    // Freed entries are taken before a shard's slab grows; a shard given more
    // new keys than it freed grows by the difference.
    assert!(reused > 95_000, "{reused} of 100,000 reused");
    for (i, &p) in fresh.iter().enumerate() {
        assert_eq!(fleet.key_at(p), Some(u64::MAX - i as u64));
    }
    for (&k, &p) in keys.iter().zip(&pos).skip(1).step_by(2) {
        assert_eq!(fleet.key_at(p), Some(k));
        assert_eq!(fleet.record(k, s) & (GPU | CPU), GPU);
    }
}
