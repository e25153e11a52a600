//! The rule that picks the settings to recommend from a sweep's results: the
//! best `prefix_aware` setting (the strategy SageMaker users tune), and the
//! best `longest_prefix` setting by the same rule, compared against it.

use serde::Serialize;

use kvgate_routing::Strategy;

use super::engine::RunStats;
use super::sweep::Setting;

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
    /// The best prompt-blind strategy by the same score (index), and the change against it.
    pub best_other: Option<usize>,
    pub p50_vs_best_other: Option<f64>,
    pub p90_vs_best_other: Option<f64>,
    /// The best `longest_prefix` setting, when it ran beside the recommended one.
    pub longest_prefix: Option<Alternative>,
}

/// The best setting of a second swept strategy, against the recommended one.
#[derive(Debug, Clone, Serialize)]
pub struct Alternative {
    pub index: usize,
    pub balanced: bool,
    pub p50_vs_random: Option<f64>,
    pub p90_vs_random: Option<f64>,
    /// Relative P50 / P90 TTFT change against the recommended setting.
    pub p50_vs_recommended: Option<f64>,
    pub p90_vs_recommended: Option<f64>,
    /// Its hit rate minus the recommended setting's (a fraction, not relative).
    pub hit_vs_recommended: f64,
}

/// Scores within this fraction of the best count as tied (differences smaller
/// than the model's step quantisation); among them the higher hit rate wins,
/// since it buys headroom and GPU time at equal latency.
pub const TIE_BAND: f64 = 0.02;

fn score(r: &RunStats) -> f64 {
    r.ttft_p50_ms + r.ttft_p90_ms
}

fn change(new: f64, old: f64) -> Option<f64> {
    (old > 0.0).then(|| new / old - 1.0)
}

/// Best P50 + P90 TTFT among `candidates` whose busiest instance takes at most
/// `bound` of requests (all of them when none does: then `false`); scores
/// within [`TIE_BAND`] of the best go to the higher hit rate (then the lower
/// score, then the earlier setting).
fn pick(candidates: &[(usize, &RunStats)], bound: f64) -> Option<(usize, bool)> {
    let balanced: Vec<(usize, &RunStats)> = candidates
        .iter()
        .copied()
        .filter(|(_, r)| r.max_share <= bound + 1e-12)
        .collect();
    let is_balanced = !balanced.is_empty();
    let pool = if is_balanced {
        balanced
    } else {
        candidates.to_vec()
    };
    let top = pool.iter().map(|(_, r)| score(r)).min_by(f64::total_cmp)?;
    let (index, _) = pool
        .into_iter()
        .filter(|(_, r)| score(r) <= top * (1.0 + TIE_BAND))
        .min_by(|(_, a), (_, b)| {
            b.hit_rate
                .total_cmp(&a.hit_rate)
                .then(score(a).total_cmp(&score(b)))
        })?;
    Some((index, is_balanced))
}

/// Recommend a `prefix_aware` setting by [`pick`]'s rule (without prefix_aware
/// runs, among the other non-`longest_prefix` runs; without those, among all),
/// and name the best `longest_prefix` setting by the same rule beside it.
pub fn recommend(
    settings: &[Setting],
    results: &[RunStats],
    instances: usize,
    tolerance: f64,
) -> Option<Recommendation> {
    let bound = (1.0 + tolerance.max(0.0)) / instances.max(1) as f64;
    let strategy_of = |i: usize| settings.get(i).map(|s| s.strategy);
    let runs: Vec<(usize, &RunStats)> = results.iter().enumerate().collect();
    let of = |keep: &dyn Fn(Strategy) -> bool| -> Vec<(usize, &RunStats)> {
        runs.iter()
            .copied()
            .filter(|(i, _)| strategy_of(*i).is_some_and(keep))
            .collect()
    };
    let aware = of(&|s| s == Strategy::PrefixAware);
    let longest = of(&|s| s == Strategy::LongestPrefix);
    let blind = of(&|s| !matches!(s, Strategy::PrefixAware | Strategy::LongestPrefix));
    let (candidates, beside) = if !aware.is_empty() {
        (aware, longest)
    } else if !blind.is_empty() {
        (blind.clone(), longest)
    } else {
        (runs.clone(), Vec::new())
    };
    let (index, balanced) = pick(&candidates, bound)?;
    let best = results.get(index)?;
    let random = runs
        .iter()
        .find(|(i, _)| strategy_of(*i) == Some(Strategy::Random))
        .map(|(_, r)| *r);
    let vs_random = |r: &RunStats| {
        (
            random.and_then(|x| change(r.ttft_p50_ms, x.ttft_p50_ms)),
            random.and_then(|x| change(r.ttft_p90_ms, x.ttft_p90_ms)),
        )
    };
    let other = blind
        .iter()
        .filter(|(i, _)| *i != index)
        .min_by(|(_, a), (_, b)| score(a).total_cmp(&score(b)))
        .copied();
    let longest_prefix = pick(&beside, bound).and_then(|(i, balanced)| {
        let r = results.get(i)?;
        let (p50_vs_random, p90_vs_random) = vs_random(r);
        Some(Alternative {
            index: i,
            balanced,
            p50_vs_random,
            p90_vs_random,
            p50_vs_recommended: change(r.ttft_p50_ms, best.ttft_p50_ms),
            p90_vs_recommended: change(r.ttft_p90_ms, best.ttft_p90_ms),
            hit_vs_recommended: r.hit_rate - best.hit_rate,
        })
    });
    let (p50_vs_random, p90_vs_random) = vs_random(best);
    Some(Recommendation {
        index,
        balanced,
        max_share_bound: bound,
        p50_vs_random,
        p90_vs_random,
        best_other: other.map(|(i, _)| i),
        p50_vs_best_other: other.and_then(|(_, r)| change(best.ttft_p50_ms, r.ttft_p50_ms)),
        p90_vs_best_other: other.and_then(|(_, r)| change(best.ttft_p90_ms, r.ttft_p90_ms)),
        longest_prefix,
    })
}

#[cfg(test)]
#[path = "recommend_tests.rs"]
mod tests;
