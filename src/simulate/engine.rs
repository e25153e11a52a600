//! The discrete-event loop: trace arrivals and instances' step ends, in virtual
//! time order. Each arrival is routed by the gateway's own [`Policy`] from the
//! instances' in-flight counts (dispatched and not finished, as the gateway's
//! in-flight guards count them), so `concurrency_threshold` overflow happens
//! exactly as it would live. Cost: O(log) per cache block touched plus
//! O(instances + running) per event; no allocation per step.

use serde::Serialize;

use crate::routing::{Load, Policy, Reason, Request};

use super::instance::{Instance, Record, Timing};
use super::workload::Workload;

/// What one run of the fleet measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunStats {
    pub requests: usize,
    pub rejected: usize,
    /// Cached prompt tokens over all prompt tokens (vLLM's prefix-cache hit rate).
    pub hit_rate: f64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    /// Each instance's share of requests.
    pub shares: Vec<f64>,
    pub max_share: f64,
    /// Share of requests not placed on their preferred instance (overflow or fallback).
    pub overflow: f64,
    /// Virtual seconds from the first arrival to the last token.
    pub makespan_s: f64,
}

/// Replay `w` through `instances` instances under `policy`; `keys[i]` is request
/// `i`'s routing key and arrivals are compressed by `speedup`.
pub fn run(
    w: &Workload,
    keys: &[u64],
    policy: &dyn Policy,
    timing: Timing,
    instances: usize,
    speedup: f64,
) -> RunStats {
    let n = instances.max(1);
    let speedup = if speedup.is_finite() && speedup > 0.0 {
        speedup
    } else {
        1.0
    };
    let mut fleet: Vec<Instance> = (0..n).map(|_| Instance::new(timing)).collect();
    let mut rec = Record::new(w.requests.len());
    let mut loads = vec![Load::with_in_flight(0); n];
    let mut placed = vec![0usize; n];
    let mut overflowed = 0usize;
    let mut next = 0usize;
    loop {
        let step = fleet
            .iter()
            .enumerate()
            .filter_map(|(i, inst)| inst.step_end().map(|end| (i, end)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let arrival = w.requests.get(next).map(|r| r.arrival_s / speedup);
        match (arrival, step) {
            // A step ending at an arrival's instant finishes first, so its
            // finished requests no longer count as in flight.
            (Some(at), Some((i, end))) if end <= at => fleet[i].finish(w, &mut rec),
            (Some(at), _) => {
                for (load, inst) in loads.iter_mut().zip(&fleet) {
                    load.in_flight = inst.in_flight();
                }
                let request = Request::with_key(keys.get(next).copied().unwrap_or(0));
                let plan = policy.plan(&request, &loads);
                let target = plan.order.first().copied().unwrap_or(0).min(n - 1);
                if matches!(plan.reason, Reason::Overflow | Reason::Fallback) {
                    overflowed += 1;
                }
                placed[target] += 1;
                fleet[target].submit(next, at, w, &mut rec);
                next += 1;
            }
            (None, Some((i, _))) => fleet[i].finish(w, &mut rec),
            (None, None) => break,
        }
    }
    summarize(w, &rec, &placed, overflowed, speedup)
}

fn summarize(
    w: &Workload,
    rec: &Record,
    placed: &[usize],
    overflowed: usize,
    speedup: f64,
) -> RunStats {
    let total = w.requests.len();
    let prompt: usize = w.requests.iter().map(|r| r.prompt_tokens).sum();
    let cached: usize = rec.cached.iter().sum();
    let mut ttft: Vec<f64> = rec.ttft.iter().copied().filter(|t| t.is_finite()).collect();
    ttft.sort_by(f64::total_cmp);
    let mean = if ttft.is_empty() {
        0.0
    } else {
        ttft.iter().sum::<f64>() / ttft.len() as f64
    };
    let shares: Vec<f64> = placed.iter().map(|&p| share(p, total)).collect();
    let first = w.requests.first().map_or(0.0, |r| r.arrival_s / speedup);
    RunStats {
        requests: total,
        rejected: rec.rejected,
        hit_rate: share(cached, prompt),
        ttft_mean_ms: mean * 1e3,
        ttft_p50_ms: percentile(&ttft, 0.50) * 1e3,
        ttft_p90_ms: percentile(&ttft, 0.90) * 1e3,
        ttft_p99_ms: percentile(&ttft, 0.99) * 1e3,
        max_share: shares.iter().copied().fold(0.0, f64::max),
        shares,
        overflow: share(overflowed, total),
        makespan_s: (rec.end - first).max(0.0),
    }
}

fn share(part: usize, whole: usize) -> f64 {
    super::trace::ratio(part, whole)
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{PolicySpec, Strategy, build};
    use crate::simulate::trace::TraceRequest;
    use crate::simulate::workload::routing_keys;

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

    fn simulate(strategy: Strategy, trace: &[TraceRequest]) -> RunStats {
        let ids: Vec<String> = (0..4).map(|i| format!("sim-{i}")).collect();
        let policy = build(&PolicySpec {
            strategy,
            ids: &ids,
            virtual_nodes: 160,
            concurrency_threshold: 16,
            balance_factor: None,
            block_chars: 256,
        });
        let w = Workload::new(trace, 16);
        // Room for 3 of the 8 prefixes (256 blocks each) per instance.
        let timing = Timing {
            cache_blocks: 800,
            ..Timing::from_sim(&kvgate_sim::SimConfig::llama70b_h100_tp4())
        };
        run(
            &w,
            &routing_keys(trace, 4096),
            policy.as_ref(),
            timing,
            4,
            1.0,
        )
    }

    #[test]
    fn prefix_aware_beats_random_on_shared_prefixes() {
        let trace = shared_prefix_trace();
        let aware = simulate(Strategy::PrefixAware, &trace);
        let random = simulate(Strategy::Random, &trace);
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
    }
}
