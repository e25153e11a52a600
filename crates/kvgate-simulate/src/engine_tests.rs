//! The event loop end to end on small synthetic traces: prefix routing against
//! random, and the cache-aware strategy's index, charges and placement.

use std::sync::Mutex;

use super::*;
use crate::trace::TraceRequest;
use crate::workload::routing_keys;
use kvgate_routing::cost::REQUEST_OVERHEAD;
use kvgate_routing::{Plan, PolicySpec, Strategy, build};

#[test]
fn percentile_is_nearest_rank() {
    let v: Vec<f64> = (1..=10).map(f64::from).collect();
    assert_eq!(percentile(&v, 0.5), 5.0);
    assert_eq!(percentile(&v, 0.9), 9.0);
    assert_eq!(percentile(&v, 1.0), 10.0);
    assert_eq!(percentile(&[], 0.5), 0.0);
}

/// 8 groups of requests, each group sharing a 4,096-token prefix, arriving
/// one every 250 ms: only routing by prefix keeps each group on one cache.
fn shared_prefix_trace() -> Vec<TraceRequest> {
    (0..400u64)
        .map(|i| {
            let group = i % 8;
            let mut hash_ids: Vec<u64> = (0..8).map(|b| group * 100 + b).collect();
            hash_ids.push(10_000 + i);
            TraceRequest {
                timestamp: i as f64 * 250.0,
                input_length: 8 * 512 + 100,
                output_length: 20,
                hash_ids,
            }
        })
        .collect()
}

const CONVERSATIONS: usize = 12;

/// 12 conversations of 5 turns; turn `k` holds the history of turns `0..k`
/// plus a new 512-token block, and the turns interleave one every 200 ms.
/// Three conversations fit in one instance's cache; all twelve do not.
fn conversation_trace() -> Vec<TraceRequest> {
    let (convs, turns) = (CONVERSATIONS as u64, 5u64);
    (0..convs * turns)
        .map(|i| {
            let (turn, conv) = (i / convs, i % convs);
            let hash_ids: Vec<u64> = (0..=turn).map(|k| 1000 * (conv + 1) + k).collect();
            TraceRequest {
                timestamp: i as f64 * 200.0,
                input_length: hash_ids.len() * 512,
                output_length: 20,
                hash_ids,
            }
        })
        .collect()
}

/// A policy that remembers the loads it saw and where it sent each request.
#[derive(Debug)]
struct Recording {
    inner: Box<dyn Policy>,
    seen: Mutex<Vec<(Vec<Load>, usize)>>,
}

impl Policy for Recording {
    fn plan(&self, request: &Request, loads: &[Load]) -> Plan {
        let plan = self.inner.plan(request, loads);
        if let Ok(mut v) = self.seen.lock() {
            v.push((loads.to_vec(), plan.order[0]));
        }
        plan
    }

    fn queued_charge(&self, request: &Request, load: &Load) -> u64 {
        self.inner.queued_charge(request, load)
    }
}

const INSTANCES: usize = 4;

/// Run `trace` on 4 instances of 800 16-token blocks each (room for three of
/// `shared_prefix_trace`'s prefixes); returns the stats and, per request, the
/// loads the policy saw and the instance it chose.
fn simulate_seen(
    strategy: Strategy,
    trace: &[TraceRequest],
) -> (RunStats, Vec<(Vec<Load>, usize)>) {
    let ids: Vec<String> = (0..INSTANCES).map(|i| format!("sim-{i}")).collect();
    let policy = Recording {
        inner: build(&PolicySpec {
            strategy,
            ids: &ids,
            virtual_nodes: 160,
            concurrency_threshold: 16,
            balance_factor: None,
            block_chars: 256,
            block_size: 16,
        }),
        seen: Mutex::new(Vec::new()),
    };
    let w = Workload::new(trace, 16);
    let timing = Timing {
        cache_blocks: 800,
        ..Timing::from_sim(&kvgate_sim::SimConfig::llama70b_h100_tp4())
    };
    let chains = Chains::new(trace, 256, 1024);
    let routing = Routing {
        policy: &policy,
        keys: &routing_keys(trace, 4096),
        cache_aware: strategy.uses_index().then_some(CacheAware {
            chains: &chains,
            index_blocks: super::super::chain::index_blocks(800 * 16, 256),
        }),
    };
    let stats = run(&w, routing, timing, INSTANCES, 1.0);
    (stats, policy.seen.into_inner().unwrap_or_default())
}

fn simulate(strategy: Strategy, trace: &[TraceRequest]) -> (RunStats, Vec<usize>) {
    let (stats, seen) = simulate_seen(strategy, trace);
    (stats, seen.into_iter().map(|(_, i)| i).collect())
}

#[test]
fn prefix_aware_beats_random_on_shared_prefixes() {
    let trace = shared_prefix_trace();
    let (aware, _) = simulate(Strategy::PrefixAware, &trace);
    let (random, _) = simulate(Strategy::Random, &trace);
    assert_eq!((aware.requests, aware.rejected), (400, 0));
    // Each group is cold once on its instance: 392 of 400 hit 4,096 of 4,196 tokens.
    assert!(aware.hit_rate > 0.95, "{}", aware.hit_rate);
    // Random spreads all 8 prefixes over every 3-prefix cache: mostly misses.
    assert!(random.hit_rate < 0.6, "{random:?}");
    assert!(
        aware.ttft_p50_ms * 5.0 < random.ttft_p50_ms,
        "{aware:?} vs {random:?}"
    );
    assert!((aware.shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    assert_eq!(
        (aware.spread, aware.cold, aware.believed_hit),
        (0.0, 0.0, 0.0)
    );
}

#[test]
fn longest_prefix_hits_at_least_as_often_as_prefix_aware() {
    let trace = shared_prefix_trace();
    let (aware, _) = simulate(Strategy::PrefixAware, &trace);
    let (longest, _) = simulate(Strategy::LongestPrefix, &trace);
    assert_eq!((longest.requests, longest.rejected), (400, 0));
    assert!(
        longest.hit_rate >= aware.hit_rate,
        "{longest:?} vs {aware:?}"
    );
    // The 8 groups' first requests found nothing anywhere.
    assert!(
        (longest.cold - 8.0 / 400.0).abs() < 1e-9,
        "{}",
        longest.cold
    );
    // The index's belief matches the cache (to the 256-character block).
    assert!(
        (longest.believed_hit - longest.hit_rate).abs() < 0.02,
        "{longest:?}"
    );
}

#[test]
fn each_turn_lands_where_its_history_is() {
    let trace = conversation_trace();
    let (longest, placed) = simulate(Strategy::LongestPrefix, &trace);
    assert_eq!(placed.len(), trace.len());
    let n = CONVERSATIONS;
    for (i, &inst) in placed.iter().enumerate().skip(n) {
        assert_eq!(
            inst,
            placed[i - n],
            "turn {} of conversation {}",
            i / n,
            i % n
        );
    }
    // Cold first turns spread by load; prefix_aware's 4,096-character window
    // keys a one-block first turn apart from the rest of its conversation.
    assert!(longest.max_share <= 0.5, "{longest:?}");
    let (aware, _) = simulate(Strategy::PrefixAware, &trace);
    assert!(
        longest.hit_rate > aware.hit_rate,
        "{longest:?} vs {aware:?}"
    );
}

#[test]
fn charges_are_held_until_the_first_token() {
    // 8,192-token prompts: the first, cold, at 0 s (prefill ≈ 0.7 s, then 10 s
    // of decode); another cold one at 0.1 s; a third at 3 s; then a repeat of
    // the first at 3.1 s.
    let at = [0.0, 100.0, 3000.0, 3100.0];
    let prefix = [0u64, 1, 2, 0];
    let trace: Vec<TraceRequest> = at
        .iter()
        .zip(prefix)
        .map(|(&timestamp, p)| TraceRequest {
            timestamp,
            input_length: 8192,
            output_length: 400,
            hash_ids: (0..16).map(|b| 100 * p + b).collect(),
        })
        .collect();
    let (stats, seen) = simulate_seen(Strategy::LongestPrefix, &trace);
    let first = seen[0].1;
    // While the first prefills, its whole prompt (+ the overhead) is queued there.
    assert_eq!(seen[1].0[first].queued_prefill, 8192 + REQUEST_OVERHEAD);
    assert_ne!(seen[1].1, first, "a cold prompt avoids the queue");
    // After its first token the charge is gone, though it is still decoding.
    assert_eq!(seen[2].0[first].in_flight, 1);
    assert!(
        seen[2].0.iter().all(|l| l.queued_prefill == 0),
        "{:?}",
        seen[2].0
    );
    // The repeat is matched in full where the first went, and goes there.
    assert_eq!(seen[3].0[first].matched_blocks, 8192 * 4 / 256);
    assert_eq!(seen[3].1, first);
    assert_eq!(stats.cold, 0.75);
}
