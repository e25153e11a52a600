//! The grid of settings (`prefix_aware` over `prefix_length` × `concurrency_threshold`,
//! each other strategy once), run in parallel over one shared workload, and the
//! rule that picks the setting to recommend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Serialize, Serializer};

use crate::routing::{PolicySpec, Strategy, build};

use super::engine::{RunStats, run};
use super::instance::Timing;
use super::trace::TraceRequest;
use super::workload::{Workload, routing_keys};

/// One point of the sweep. Strategies that ignore the prompt and the in-flight
/// threshold have neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Setting {
    #[serde(serialize_with = "strategy_name")]
    pub strategy: Strategy,
    pub prefix_length: Option<usize>,
    pub concurrency_threshold: Option<usize>,
}

fn strategy_name<S: Serializer>(s: &Strategy, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.as_str())
}

/// The fleet every setting runs on.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    pub instances: usize,
    pub timing: Timing,
    /// Arrival times are divided by this.
    pub speedup: f64,
    pub virtual_nodes: usize,
    pub balance_factor: Option<f64>,
}

/// Every setting to run, in the order given (duplicate strategies once).
pub fn grid(
    strategies: &[Strategy],
    prefix_lengths: &[usize],
    thresholds: &[usize],
) -> Vec<Setting> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for &strategy in strategies {
        if seen.contains(&strategy) {
            continue;
        }
        seen.push(strategy);
        if strategy != Strategy::PrefixAware {
            out.push(Setting {
                strategy,
                prefix_length: None,
                concurrency_threshold: None,
            });
            continue;
        }
        for &p in prefix_lengths {
            for &t in thresholds {
                out.push(Setting {
                    strategy,
                    prefix_length: Some(p),
                    concurrency_threshold: Some(t.max(1)),
                });
            }
        }
    }
    out
}

/// Run every setting on `threads` threads; results come back in `settings` order.
pub fn sweep(
    trace: &[TraceRequest],
    w: &Workload,
    settings: &[Setting],
    fleet: &Fleet,
    threads: usize,
) -> anyhow::Result<Vec<RunStats>> {
    let mut keys: HashMap<usize, Vec<u64>> = HashMap::new();
    for p in settings.iter().filter_map(|s| s.prefix_length) {
        keys.entry(p).or_insert_with(|| routing_keys(trace, p));
    }
    let ids: Vec<String> = (0..fleet.instances.max(1))
        .map(|i| format!("instance-{i}"))
        .collect();
    let next = AtomicUsize::new(0);
    let one = |i: usize, s: &Setting| {
        let policy = build(&PolicySpec {
            strategy: s.strategy,
            ids: &ids,
            virtual_nodes: fleet.virtual_nodes,
            concurrency_threshold: s.concurrency_threshold.unwrap_or(usize::MAX),
            balance_factor: fleet.balance_factor,
            block_chars: 256,
        });
        let k = s.prefix_length.and_then(|p| keys.get(&p));
        let stats = run(
            w,
            k.map_or(&[][..], Vec::as_slice),
            policy.as_ref(),
            fleet.timing,
            ids.len(),
            fleet.speedup,
        );
        (i, stats)
    };
    let workers = threads.clamp(1, settings.len().max(1));
    let mut done: Vec<(usize, RunStats)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(s) = settings.get(i) else { break };
                        mine.push(one(i, s));
                    }
                    mine
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?,
            );
        }
        Ok::<_, anyhow::Error>(all)
    })?;
    done.sort_by_key(|(i, _)| *i);
    Ok(done.into_iter().map(|(_, s)| s).collect())
}

/// The setting to recommend and how it compares.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// Index into the settings and results.
    pub index: usize,
    /// Whether it met the balance bound (false: nothing did; best TTFT regardless).
    pub balanced: bool,
    /// Largest instance share counted as balanced: (1 + tolerance) / instances.
    pub max_share_bound: f64,
    /// Relative P50 / P90 TTFT change against `random`, when random was run.
    pub p50_vs_random: Option<f64>,
    pub p90_vs_random: Option<f64>,
    /// The best other strategy by the same score (index), and the change against it.
    pub best_other: Option<usize>,
    pub p50_vs_best_other: Option<f64>,
    pub p90_vs_best_other: Option<f64>,
}

/// Scores within this fraction of the best count as tied (differences smaller
/// than the model's step quantisation); among them the higher hit rate wins,
/// since it buys headroom and GPU time at equal latency.
pub const TIE_BAND: f64 = 0.02;

/// Best P50 + P90 TTFT among `prefix_aware` settings whose busiest instance
/// takes at most `(1 + tolerance)/instances` of requests; scores within
/// [`TIE_BAND`] of the best go to the higher hit rate (then the lower score,
/// then the earlier setting). Without prefix_aware runs, among all runs.
pub fn recommend(
    settings: &[Setting],
    results: &[RunStats],
    instances: usize,
    tolerance: f64,
) -> Option<Recommendation> {
    let bound = (1.0 + tolerance.max(0.0)) / instances.max(1) as f64;
    let runs: Vec<(usize, &RunStats)> = results.iter().enumerate().collect();
    let aware: Vec<(usize, &RunStats)> = runs
        .iter()
        .copied()
        .filter(|(i, _)| {
            settings
                .get(*i)
                .is_some_and(|s| s.strategy == Strategy::PrefixAware)
        })
        .collect();
    let candidates = if aware.is_empty() {
        runs.clone()
    } else {
        aware
    };
    let balanced: Vec<(usize, &RunStats)> = candidates
        .iter()
        .copied()
        .filter(|(_, r)| r.max_share <= bound + 1e-12)
        .collect();
    let is_balanced = !balanced.is_empty();
    let pool = if is_balanced { balanced } else { candidates };
    let score = |r: &RunStats| r.ttft_p50_ms + r.ttft_p90_ms;
    let top = pool.iter().map(|(_, r)| score(r)).min_by(f64::total_cmp)?;
    let (index, best) = pool
        .into_iter()
        .filter(|(_, r)| score(r) <= top * (1.0 + TIE_BAND))
        .min_by(|(_, a), (_, b)| {
            b.hit_rate
                .total_cmp(&a.hit_rate)
                .then(score(a).total_cmp(&score(b)))
        })?;
    let strategy_of = |i: usize| settings.get(i).map(|s| s.strategy);
    let random = runs
        .iter()
        .find(|(i, _)| strategy_of(*i) == Some(Strategy::Random))
        .map(|(_, r)| *r);
    let other = runs
        .iter()
        .filter(|(i, _)| strategy_of(*i).is_some_and(|s| s != Strategy::PrefixAware))
        .min_by(|(_, a), (_, b)| score(a).total_cmp(&score(b)))
        .copied();
    let change = |new: f64, old: f64| (old > 0.0).then(|| new / old - 1.0);
    Some(Recommendation {
        index,
        balanced: is_balanced,
        max_share_bound: bound,
        p50_vs_random: random.and_then(|r| change(best.ttft_p50_ms, r.ttft_p50_ms)),
        p90_vs_random: random.and_then(|r| change(best.ttft_p90_ms, r.ttft_p90_ms)),
        best_other: other.map(|(i, _)| i),
        p50_vs_best_other: other.and_then(|(_, r)| change(best.ttft_p50_ms, r.ttft_p50_ms)),
        p90_vs_best_other: other.and_then(|(_, r)| change(best.ttft_p90_ms, r.ttft_p90_ms)),
    })
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
