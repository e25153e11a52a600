//! The recommendation rule by hand: balance bound, tie band, and the
//! `longest_prefix` pick beside the `prefix_aware` one.

use super::*;

pub(crate) fn stats(p50: f64, p90: f64, hit: f64, max_share: f64) -> RunStats {
    RunStats {
        requests: 100,
        rejected: 0,
        hit_rate: hit,
        ttft_mean_ms: p50,
        ttft_p50_ms: p50,
        ttft_p90_ms: p90,
        ttft_p99_ms: p90,
        shares: vec![],
        max_share,
        overflow: 0.0,
        spread: 0.0,
        cold: 0.0,
        believed_hit: 0.0,
        makespan_s: 1.0,
    }
}

fn aware(p: usize, t: usize) -> Setting {
    Setting {
        prefix_length: Some(p),
        concurrency_threshold: Some(t),
        ..Setting::plain(Strategy::PrefixAware)
    }
}

fn longest(b: usize, c: usize) -> Setting {
    Setting {
        concurrency_threshold: Some(256),
        block_chars: Some(b),
        cache_tokens: Some(c),
        ..Setting::plain(Strategy::LongestPrefix)
    }
}

#[test]
fn recommends_the_fastest_balanced_setting() {
    let settings = [
        Setting::plain(Strategy::Random),
        aware(1024, 64), // fastest, but one instance takes 40%
        aware(4096, 8),  // best balanced score
        aware(4096, 16), // same score, lower hit rate
        aware(8192, 1),  // slower by 30%
    ];
    let results = [
        stats(1000.0, 3000.0, 0.1, 0.15),
        stats(100.0, 500.0, 0.5, 0.40),
        stats(200.0, 800.0, 0.4, 0.16),
        stats(200.0, 800.0, 0.3, 0.16),
        stats(400.0, 900.0, 0.6, 0.15),
    ];
    let r = recommend(&settings, &results, 7, 0.25).unwrap();
    assert_eq!(r.index, 2);
    assert!(r.balanced);
    assert!((r.max_share_bound - 1.25 / 7.0).abs() < 1e-12);
    assert!((r.p50_vs_random.unwrap() + 0.8).abs() < 1e-12);
    assert!((r.p90_vs_random.unwrap() - (800.0 / 3000.0 - 1.0)).abs() < 1e-12);
    assert_eq!(r.best_other, Some(0), "random is the only other strategy");
    assert!(r.longest_prefix.is_none(), "longest_prefix was not run");
    // Nothing balanced: the fastest regardless, flagged.
    let r = recommend(&settings, &results, 7, -1.0).unwrap();
    assert_eq!((r.index, r.balanced), (1, false));
    assert!(recommend(&[], &[], 7, 0.25).is_none());
}

#[test]
fn near_ties_go_to_the_higher_hit_rate() {
    let settings = [aware(4096, 8), aware(16384, 16), aware(1024, 1)];
    let results = [
        stats(200.0, 800.0, 0.10, 0.15),
        stats(205.0, 810.0, 0.25, 0.15), // 1.5% slower: a tie, and more hits
        stats(190.0, 900.0, 0.90, 0.15), // 9% slower: not a tie
    ];
    let r = recommend(&settings, &results, 7, 0.25).unwrap();
    assert_eq!(r.index, 1);
    assert_eq!(r.p50_vs_random, None, "random was not run");
}

#[test]
fn the_best_longest_prefix_setting_is_named_beside_and_compared() {
    let settings = [
        aware(4096, 8),
        longest(256, 384_000),
        longest(512, 384_000), // faster but unbalanced
        longest(128, 192_000),
        Setting::plain(Strategy::LeastOutstandingRequests),
    ];
    let results = [
        stats(200.0, 800.0, 0.10, 0.15),
        stats(150.0, 600.0, 0.30, 0.16),
        stats(100.0, 300.0, 0.35, 0.30),
        stats(300.0, 900.0, 0.40, 0.15),
        stats(220.0, 700.0, 0.05, 0.15),
    ];
    let r = recommend(&settings, &results, 7, 0.25).unwrap();
    assert_eq!(r.index, 0, "the recommendation stays prefix_aware");
    assert_eq!(
        r.best_other,
        Some(4),
        "longest_prefix is not the 'other' strategy"
    );
    let l = r.longest_prefix.unwrap();
    assert_eq!((l.index, l.balanced), (1, true));
    assert!((l.p50_vs_recommended.unwrap() + 0.25).abs() < 1e-12);
    assert!((l.p90_vs_recommended.unwrap() + 0.25).abs() < 1e-12);
    assert!((l.hit_vs_recommended - 0.20).abs() < 1e-12);
    // Without prefix_aware the prompt-blind runs are recommended, longest beside.
    let r = recommend(&settings[1..], &results[1..], 7, 0.25).unwrap();
    assert_eq!((r.index, r.best_other), (3, None));
    assert_eq!(r.longest_prefix.map(|l| l.index), Some(0));
    // Only longest_prefix: it is the recommendation, with nothing beside it.
    let r = recommend(&settings[1..4], &results[1..4], 7, 0.25).unwrap();
    assert_eq!(r.index, 0);
    assert!(r.longest_prefix.is_none());
}
