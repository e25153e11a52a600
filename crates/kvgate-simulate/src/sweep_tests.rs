//! The grid, a sweep's ordering and settings, and a sweep over a real trace's head.

use super::*;
use crate::recommend::recommend;

fn aware(p: usize, t: usize) -> Setting {
    Setting {
        prefix_length: Some(p),
        concurrency_threshold: Some(t),
        ..Setting::plain(Strategy::PrefixAware)
    }
}

fn axes(prefix_lengths: &[usize], thresholds: &[usize]) -> Axes {
    Axes {
        prefix_lengths: prefix_lengths.to_vec(),
        thresholds: thresholds.to_vec(),
        block_chars: vec![256, 1024],
        cache_tokens: vec![192_000, 384_000, 768_000],
        longest_threshold: 256,
    }
}

#[test]
fn grid_sweeps_both_cache_strategies_and_runs_others_once() {
    let g = grid(
        &[
            Strategy::Random,
            Strategy::PrefixAware,
            Strategy::Random,
            Strategy::LongestPrefix,
        ],
        &axes(&[1024, 4096], &[1, 8, 64]),
    );
    assert_eq!(g.len(), 1 + 6 + 6);
    assert_eq!(g[0], Setting::plain(Strategy::Random));
    assert_eq!(g[1], aware(1024, 1));
    assert_eq!(g[6], aware(4096, 64));
    let l = g[7];
    assert_eq!(
        (l.strategy, l.prefix_length, l.concurrency_threshold),
        (Strategy::LongestPrefix, None, Some(256))
    );
    assert_eq!((l.block_chars, l.cache_tokens), (Some(256), Some(192_000)));
    assert_eq!(
        (g[12].block_chars, g[12].cache_tokens),
        (Some(1024), Some(768_000))
    );
}

fn fleet(instances: usize) -> Fleet {
    Fleet {
        instances,
        timing: Timing::from_sim(&kvgate_sim::SimConfig::llama70b_h100_tp4()),
        speedup: 1.0,
        virtual_nodes: 160,
        balance_factor: None,
        max_prompt_blocks: 1024,
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
    let mut ax = axes(&[1024], &[1, 64]);
    ax.block_chars = vec![256];
    ax.cache_tokens = vec![1024, 384_000];
    let settings = grid(
        &[
            Strategy::PrefixAware,
            Strategy::RoundRobin,
            Strategy::LongestPrefix,
        ],
        &ax,
    );
    let results = sweep(&trace, &w, &settings, &fleet(3), 2).unwrap();
    assert_eq!(results.len(), 5);
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
    // longest_prefix ran with its index: a gateway assuming 1,024 tokens a
    // cache (16 blocks, less than one prompt's 32) believes less is cached
    // and finds more prompts cold.
    // With the cache's real size its belief is what the cache served.
    let (small, right) = (&results[3], &results[4]);
    assert!(
        (right.believed_hit - right.hit_rate).abs() < 0.02,
        "{right:?}"
    );
    assert!(
        small.believed_hit < right.believed_hit,
        "{small:?} vs {right:?}"
    );
    assert!(small.cold > right.cold);
    assert_eq!(results[0].believed_hit, 0.0);
}

/// The head of the real conversation trace, when ../shared is there.
#[test]
fn real_trace_head_sweeps_quickly() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/mooncake_conversation.jsonl");
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
    let mut ax = axes(&[2048, 32768], &[4, 64]);
    ax.block_chars = vec![256];
    ax.cache_tokens = vec![384_000];
    let settings = grid(
        &[
            Strategy::PrefixAware,
            Strategy::Random,
            Strategy::LongestPrefix,
        ],
        &ax,
    );
    let results = sweep(&trace, &w, &settings, &fleet, 2).unwrap();
    assert_eq!(results.len(), 6);
    let ceiling = w.token_ceiling();
    for r in &results {
        assert_eq!((r.requests, r.rejected), (400, 0));
        assert!(r.hit_rate <= ceiling + 1e-9, "{} > {ceiling}", r.hit_rate);
        assert!(r.ttft_p50_ms > 0.0 && r.ttft_p50_ms <= r.ttft_p90_ms);
    }
    // Routing on the shared system prompt alone (2,048 chars) piles the load up.
    assert!(results[1].max_share > results[4].max_share);
    // longest_prefix follows each conversation while it spreads load: more hits
    // than prefix_aware where that overflows (threshold 4), and a lower P90
    // than any prefix_aware setting.
    let lp = &results[5];
    assert!(
        lp.hit_rate >= results[0].hit_rate.max(results[2].hit_rate),
        "{lp:?}"
    );
    assert!(
        results[..4].iter().all(|r| lp.ttft_p90_ms < r.ttft_p90_ms),
        "{lp:?}"
    );
    let r = recommend(&settings, &results, 7, 0.25).unwrap();
    assert_eq!(r.longest_prefix.map(|l| l.index), Some(5));
}
