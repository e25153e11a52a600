//! The comparisons under each workload's table: the cache-aware arms against
//! `random`, `longest_prefix` against `prefix_aware`, `kv_aware` against
//! `longest_prefix`, and workload 1's targets.

use std::fmt::Write as _;

use crate::{Arm, RunResult, WorkloadResult};

/// Each cache-aware arm against `random`, `longest_prefix` against
/// `prefix_aware`, `kv_aware` against `longest_prefix`, and workload 1's targets.
pub(super) fn compare(s: &mut String, w: &WorkloadResult) {
    against_random(s, w);
    longest_against_prefix_aware(s, w);
    kv_against_longest(s, w);
    targets(s, w);
}

fn against_random(s: &mut String, w: &WorkloadResult) {
    let Some(b) = w.run(Arm::Random) else {
        return;
    };
    for arm in [
        Arm::PrefixAware,
        Arm::PrefixAwareUnbounded,
        Arm::LongestPrefix,
        Arm::KvAware,
    ] {
        let Some(p) = w.run(arm) else {
            continue;
        };
        let _ = writeln!(
            s,
            "`{}` against `random`: KV hit {:.1}% → {:.1}% ({:.0}% of the ceiling); P50 TTFT \
             {:+.0}% (engine {}); P90 TTFT {:+.0}% (engine {}); requests/s {:+.1}%; output \
             tokens/s {:+.1}%; largest share deviation from 1/{} {:.1} points.\n",
            arm.label(),
            100.0 * b.hit_rate,
            100.0 * p.hit_rate,
            100.0 * w.of_ceiling(p),
            change(p.ttft_p50, b.ttft_p50),
            engine_change(p.engine_ttft_p50, b.engine_ttft_p50),
            change(p.ttft_p90, b.ttft_p90),
            engine_change(p.engine_ttft_p90, b.engine_ttft_p90),
            change(p.requests_per_s, b.requests_per_s),
            change(p.output_tokens_per_s, b.output_tokens_per_s),
            p.shares.len(),
            100.0 * spread(p),
        );
    }
}

/// Workload 1's targets (SageMaker's figures), at the workload's own cache size.
fn targets(s: &mut String, w: &WorkloadResult) {
    if let (Some(b), Some(p), "long-context", false) = (
        w.run(Arm::Random),
        w.run(Arm::PrefixAware),
        w.setup_id.as_str(),
        w.is_cache_scaled(),
    ) {
        let check = |ok: bool| if ok { "met" } else { "NOT met" };
        let _ = writeln!(
            s,
            "Targets (SageMaker's figures), `prefix_aware` against `random`: hit ≥ 80%: {}; \
             random ≤ 30%: {}; every share within 2 points of 1/7: {}; P50 TTFT reduction ≥ \
             70%: {}.\n",
            check(p.hit_rate >= 0.80),
            check(b.hit_rate <= 0.30),
            check(spread(p) <= 0.02),
            check(change(p.ttft_p50, b.ttft_p50) <= -70.0),
        );
    }
}

/// `longest_prefix` against `prefix_aware`: hit rates, TTFT ratios, balance.
fn longest_against_prefix_aware(s: &mut String, w: &WorkloadResult) {
    let (Some(l), Some(p)) = (w.run(Arm::LongestPrefix), w.run(Arm::PrefixAware)) else {
        return;
    };
    let ratio = |a: f64, b: f64| format!("{:.2}×", a / b.max(1e-12));
    let engine_ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => "–".to_owned(),
    };
    let _ = writeln!(
        s,
        "`longest_prefix` against `prefix_aware`: KV hit {:.1}% → {:.1}% ({:+.1} points; \
         {:.0}% of the ceiling); P50 TTFT {} of `prefix_aware`'s (engine {}); P90 TTFT {} \
         (engine {}); largest share deviation from 1/{} {:.1} → {:.1} points; sent away from the \
         instance holding most of the prefix (overflow → cache_spread) {} → {}.\n",
        100.0 * p.hit_rate,
        100.0 * l.hit_rate,
        100.0 * (l.hit_rate - p.hit_rate),
        100.0 * w.of_ceiling(l),
        ratio(l.ttft_p50, p.ttft_p50),
        engine_ratio(l.engine_ttft_p50, p.engine_ttft_p50),
        ratio(l.ttft_p90, p.ttft_p90),
        engine_ratio(l.engine_ttft_p90, p.engine_ttft_p90),
        l.shares.len(),
        100.0 * spread(p),
        100.0 * spread(l),
        p.moved(),
        l.moved(),
    );
}

fn change(new: f64, old: f64) -> f64 {
    100.0 * (new - old) / old.max(1e-12)
}

fn engine_change(new: Option<f64>, old: Option<f64>) -> String {
    match (new, old) {
        (Some(n), Some(o)) => format!("{:+.0}%", change(n, o)),
        _ => "–".to_owned(),
    }
}

/// Largest distance of an instance's share from an even split.
pub(super) fn spread(r: &RunResult) -> f64 {
    let even = 1.0 / r.shares.len().max(1) as f64;
    r.shares
        .iter()
        .map(|x| (x - even).abs())
        .fold(0.0, f64::max)
}

/// `kv_aware` against `longest_prefix`: the same placement, on the
/// instances' own events (real tokens) instead of the gateway's own guesses.
fn kv_against_longest(s: &mut String, w: &WorkloadResult) {
    let (Some(k), Some(l)) = (w.run(Arm::KvAware), w.run(Arm::LongestPrefix)) else {
        return;
    };
    let ratio = |a: f64, b: f64| format!("{:.2}×", a / b.max(1e-12));
    let _ = writeln!(
        s,
        "`kv_aware` against `longest_prefix`: KV hit {:.1}% → {:.1}% ({:.0}% → {:.0}% of \
         the ceiling in each one's own tokens); P50 TTFT {} of `longest_prefix`'s, P90 TTFT {}; \
         largest share deviation from 1/{} {:.1} → {:.1} points; cache_spread {} → {}. Its \
         instances counted {} SmolLM2 tokens for the same requests' {} 4-byte chunks \
         ({:.2}×); with {:.2}× the KV tokens and prefill rate (`--kv-token-ratio`), they held \
         {:.2}× the text and prefilled it at {:.2}× the speed.\n",
        100.0 * l.hit_rate,
        100.0 * k.hit_rate,
        100.0 * w.of_ceiling(l),
        100.0 * w.of_ceiling(k),
        ratio(k.ttft_p50, l.ttft_p50),
        ratio(k.ttft_p90, l.ttft_p90),
        k.shares.len(),
        100.0 * spread(l),
        100.0 * spread(k),
        l.moved(),
        k.moved(),
        k.prompt_tokens,
        l.prompt_tokens,
        token_ratio(k, l),
        w.kv_token_ratio,
        w.kv_token_ratio / token_ratio(k, l).max(1e-9),
        w.kv_token_ratio / token_ratio(k, l).max(1e-9),
    );
}

/// Prompt tokens `a`'s instances counted per token `b`'s did.
pub(super) fn token_ratio(a: &RunResult, b: &RunResult) -> f64 {
    a.prompt_tokens as f64 / (b.prompt_tokens as f64).max(1.0)
}
