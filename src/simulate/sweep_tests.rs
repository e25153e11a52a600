//! The grid, the recommendation rule, and a sweep over a real trace's head.

use super::*;

fn stats(p50: f64, p90: f64, hit: f64, max_share: f64) -> RunStats {
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
        makespan_s: 1.0,
    }
}

fn aware(p: usize, t: usize) -> Setting {
    Setting {
        strategy: Strategy::PrefixAware,
        prefix_length: Some(p),
        concurrency_threshold: Some(t),
    }
}

#[test]
fn grid_sweeps_prefix_aware_and_runs_others_once() {
    let g = grid(
        &[Strategy::Random, Strategy::PrefixAware, Strategy::Random],
        &[1024, 4096],
        &[1, 8, 64],
    );
    assert_eq!(g.len(), 1 + 6);
    assert_eq!(g[0].strategy, Strategy::Random);
    assert_eq!(g[0].prefix_length, None);
    assert_eq!(g[1], aware(1024, 1));
    assert_eq!(g[6], aware(4096, 64));
}

#[test]
fn recommends_the_fastest_balanced_setting() {
    let settings = [
        Setting {
            strategy: Strategy::Random,
            prefix_length: None,
            concurrency_threshold: None,
        },
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

fn fleet(instances: usize) -> Fleet {
    Fleet {
        instances,
        timing: Timing::from_sim(&kvgate_sim::SimConfig::llama70b_h100_tp4()),
        speedup: 1.0,
        virtual_nodes: 160,
        balance_factor: None,
    }
}

#[test]
fn sweep_returns_results_in_settings_order() {
    let trace: Vec<TraceRequest> = (0..60u64)
        .map(|i| TraceRequest {
            timestamp: i as f64 * 50.0,
            input_length: 2048,
            output_length: 5,
            hash_ids: vec![i % 4, 100 + i % 4, 200 + i, 300 + i],
        })
        .collect();
    let w = Workload::new(&trace, 16);
    let settings = grid(
        &[Strategy::PrefixAware, Strategy::RoundRobin],
        &[1024],
        &[1, 64],
    );
    let results = sweep(&trace, &w, &settings, &fleet(3), 2).unwrap();
    assert_eq!(results.len(), 3);
    // Threshold 1 spills the second in-flight request of a prefix; 64 never does.
    assert!(results[1].overflow == 0.0 && results[0].overflow >= results[1].overflow);
    // Round robin spreads 60 requests evenly over 3 instances.
    assert!(
        results[2]
            .shares
            .iter()
            .all(|s| (s - 1.0 / 3.0).abs() < 1e-9)
    );
    assert!(results[1].hit_rate > results[2].hit_rate);
}

/// The head of the real conversation trace, when ../shared is there.
#[test]
fn real_trace_head_sweeps_quickly() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/traces/mooncake_conversation.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("skipped: {} not found", path.display());
        return;
    };
    let head: Vec<&str> = text.lines().take(400).collect();
    let trace = super::super::trace::parse(&head.join("\n")).unwrap();
    // The CLI's default: the trace's 512-token blocks, the same 384k tokens a cache.
    let w = Workload::new(&trace, 512);
    let mut fleet = fleet(7);
    fleet.timing.block_size = 512;
    fleet.timing.cache_blocks = 750;
    let settings = grid(
        &[Strategy::PrefixAware, Strategy::Random],
        &[2048, 32768],
        &[4, 64],
    );
    let results = sweep(&trace, &w, &settings, &fleet, 2).unwrap();
    assert_eq!(results.len(), 5);
    let ceiling = w.token_ceiling();
    for r in &results {
        assert_eq!((r.requests, r.rejected), (400, 0));
        assert!(r.hit_rate <= ceiling + 1e-9, "{} > {ceiling}", r.hit_rate);
        assert!(r.ttft_p50_ms > 0.0 && r.ttft_p50_ms <= r.ttft_p90_ms);
    }
    // Routing on the shared system prompt alone (2,048 chars) piles the load up.
    assert!(results[1].max_share > results[4].max_share);
    assert!(recommend(&settings, &results, 7, 0.25).is_some());
}
