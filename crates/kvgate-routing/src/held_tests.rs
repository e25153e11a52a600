//! The event-fed index: keys agree with requests, salts separate, tiers weigh, limits bound.
use super::*;

const W: TierWeights = TierWeights { cpu: 0.5, l2: 0.25 };

fn ids(n: u32) -> Vec<u32> {
    (0..n).collect()
}

#[test]
fn events_and_requests_agree_on_keys_and_salts_separate() {
    let tokens = ids(64);
    let mut idx = HeldIndex::new(1000);
    // Stored in two events, the second linked by the engine's parent hash.
    idx.store(
        &[100, 101],
        None,
        &tokens[..32],
        16,
        Medium::Gpu,
        seed(None),
    );
    idx.store(&[102], Some(101), &tokens[32..48], 16, Medium::Gpu, 0);
    let plain = token_keys(seed(None), &tokens, 16, 100);
    assert_eq!(plain.len(), 4);
    assert_eq!(idx.matched(&plain, None, W).blocks, 3);
    let salted = token_keys(seed(Some("t1")), &tokens, 16, 100);
    assert_eq!(
        idx.matched(&salted, None, W).blocks,
        0,
        "another salt's blocks never count"
    );
    // An unknown parent cannot be keyed.
    let a = idx.store(&[200], Some(999), &tokens[..16], 16, Medium::Gpu, 0);
    assert_eq!((a.stored, a.dropped), (0, 1));
}

#[test]
fn removal_tiers_and_the_shared_tier() {
    let tokens = ids(48);
    let keys = token_keys(seed(None), &tokens, 16, 100);
    let mut idx = HeldIndex::new(1000);
    idx.store(&[1, 2, 3], None, &tokens, 16, Medium::Gpu, seed(None));
    idx.store(&[2, 3], Some(1), &tokens[16..], 16, Medium::Cpu, 0);
    assert_eq!(idx.matched(&keys, None, W).weighted, 3.0);
    // Evicted from the GPU, still offloaded: counts at the CPU weight.
    assert_eq!(idx.remove(&[2, 3], Medium::Gpu), 2);
    let h = idx.matched(&keys, None, W);
    assert_eq!((h.blocks, h.gpu_blocks, h.weighted), (3, 1, 2.0));
    idx.remove(&[3], Medium::Cpu);
    let mut shared = HeldIndex::new(10);
    shared.store(&[9, 8, 7], None, &tokens, 16, Medium::Gpu, seed(None));
    let h = idx.matched(&keys, Some(&shared), W);
    assert_eq!((h.blocks, h.weighted), (3, 1.75));
    idx.remove(&[1], Medium::Gpu);
    assert_eq!(
        idx.matched(&keys, None, W).blocks,
        0,
        "the first block gone ends the match"
    );
}

#[test]
fn the_limit_bounds_memory_and_clear_empties() {
    let tokens = ids(16 * 10);
    let mut idx = HeldIndex::new(4);
    let hashes: Vec<u64> = (0..10).collect();
    let a = idx.store(&hashes, None, &tokens, 16, Medium::Gpu, seed(None));
    assert_eq!((a.stored, a.dropped, idx.len()), (4, 6, 4));
    idx.clear();
    assert!(idx.is_empty());
    let short = idx.store(&[1, 2], None, &tokens[..20], 16, Medium::Gpu, seed(None));
    assert_eq!(
        short.dropped, 2,
        "fewer token ids than blocks is refused whole"
    );
}

#[test]
fn a_reused_engine_hash_is_rekeyed() {
    let (a, b) = (ids(16), vec![9u32; 16]);
    let mut idx = HeldIndex::new(100);
    idx.store(&[5], None, &a, 16, Medium::Gpu, seed(None));
    idx.store(&[5], None, &b, 16, Medium::Gpu, seed(None));
    let ka = token_keys(seed(None), &a, 16, 1);
    let kb = token_keys(seed(None), &b, 16, 1);
    assert_eq!(idx.matched(&ka, None, W).blocks, 0);
    assert_eq!(idx.matched(&kb, None, W).blocks, 1);
    assert_eq!(idx.len(), 1);
}

#[test]
fn scopes_seed_apart_and_the_default_is_unsalted() {
    let s = |salt: Option<&str>, p: &str| Scope {
        salt: salt.map(str::to_owned),
        partition: p.to_owned(),
    };
    assert_eq!(Scope::default().seed(), seed(None));
    let all = [
        s(None, ""),
        s(None, "p"),
        s(Some("t"), ""),
        s(Some("t"), "p"),
        s(Some("tp"), ""),
    ];
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a.seed(), b.seed(), "{a:?} and {b:?}");
        }
    }
}

#[test]
fn a_prompt_being_prefilled_counts_until_its_events_come() {
    let tokens = ids(48);
    let keys = token_keys(seed(None), &tokens, 16, 100);
    let mut idx = HeldIndex::new(100);
    idx.expect(&keys);
    assert_eq!(
        idx.matched(&keys, None, W).blocks,
        3,
        "expected blocks count as held"
    );
    assert_eq!(idx.expected_len(), 3);
    // Its events arrive: the blocks are held, no longer merely expected.
    idx.store(&[1, 2], None, &tokens[..32], 16, Medium::Gpu, seed(None));
    assert_eq!(idx.expected_len(), 1);
    idx.unexpect(&keys);
    assert_eq!(idx.expected_len(), 0);
    assert_eq!(
        idx.matched(&keys, None, W).blocks,
        2,
        "only what events reported"
    );
    // An eviction reported later is the truth.
    idx.remove(&[1], Medium::Gpu);
    assert_eq!(idx.matched(&keys, None, W).blocks, 0);
}

#[test]
fn a_key_hashed_in_one_call_equals_the_same_bytes_fed_one_by_one() {
    for n in [0usize, 1, 16, 64, 65, 200] {
        let tokens: Vec<u32> = (0..n as u32)
            .map(|t| t.wrapping_mul(2_654_435_761))
            .collect();
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&42u64.to_le_bytes());
        for t in &tokens {
            h.update(&t.to_le_bytes());
        }
        assert_eq!(super::chain(42, &tokens), h.digest(), "{n} tokens");
    }
}

#[test]
fn churn_keeps_the_packed_store_equal_to_a_plain_map() {
    // Stores and removals in both tiers, in a pseudo-random order: after each
    // step every block is found by its engine hash and by its key, with the
    // tiers a plain map of (engine hash → tiers) says.
    let mut idx = HeldIndex::new(1 << 20);
    let mut model: std::collections::HashMap<u64, (u64, bool, bool)> = Default::default();
    let mut x = 0x1234_5678_u64;
    for step in 0..20_000u32 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let h = (x >> 33) % 512;
        let medium = if x & 1 == 0 { Medium::Gpu } else { Medium::Cpu };
        if (x >> 8).is_multiple_of(3) {
            idx.remove(&[h], medium);
            if let Some(e) = model.get_mut(&h) {
                match medium {
                    Medium::Gpu => e.1 = false,
                    Medium::Cpu => e.2 = false,
                }
                if !e.1 && !e.2 {
                    model.remove(&h);
                }
            }
        } else {
            let tokens = [h as u32; 16];
            idx.store(&[h], None, &tokens, 16, medium, seed(None));
            let key = token_keys(seed(None), &tokens, 16, 1)[0];
            let e = model.entry(h).or_insert((key, false, false));
            match medium {
                Medium::Gpu => e.1 = true,
                Medium::Cpu => e.2 = true,
            }
        }
        if step.is_multiple_of(97) || step == 19_999 {
            assert_eq!(idx.len(), model.len(), "step {step}");
            for (h, (key, gpu, _)) in &model {
                assert_eq!(idx.key_of(*h), Some(*key), "step {step}");
                let held = idx.matched(&[*key], None, W);
                assert_eq!((held.blocks, held.gpu_blocks), (1, usize::from(*gpu)));
            }
        }
    }
}

#[test]
fn a_hash_twice_in_one_event_is_applied_in_order() {
    // Engine lookups are made ahead of an event's changes; a hash the event
    // names twice must see what its first mention did.
    let tokens = ids(48);
    let keys = token_keys(seed(None), &tokens, 16, 100);
    let mut idx = HeldIndex::new(1000);
    // The third block reuses the first one's hash for other content: the
    // first block is forgotten, as it would be in two events.
    idx.store(&[1, 2, 1], None, &tokens, 16, Medium::Gpu, seed(None));
    assert_eq!(idx.len(), 2);
    assert_eq!(idx.matched(&keys, None, W).blocks, 0);
    assert_eq!(idx.matched(&keys[2..], None, W).blocks, 1);
    assert_eq!(idx.remove(&[2, 2], Medium::Gpu), 1, "removed once");
    assert_eq!(idx.remove(&[1, 1], Medium::Gpu), 1, "removed once");
    assert!(idx.is_empty());
    assert!(idx.fleet().is_empty());
    // Hashes alike but for their top two bits (the table keeps 62) are one.
    let alias = 7 | 1 << 63;
    idx.store(&[7, 8, alias], None, &tokens, 16, Medium::Gpu, seed(None));
    assert_eq!(idx.len(), 2);
    assert_eq!(idx.remove(&[7, alias], Medium::Gpu), 1, "removed once");
    assert_eq!(idx.matched(&keys[2..], None, W).blocks, 0);
}
