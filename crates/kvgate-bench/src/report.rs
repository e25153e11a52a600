//! The Markdown report: how it was run, then a table per workload, the cache-aware
//! arms against `random` and `longest_prefix` against `prefix_aware`, with
//! workload 1's targets checked.

use std::fmt::Write as _;

use crate::{Arm, RunResult, WorkloadResult};

/// Where and when it ran, for the report's header.
#[derive(Clone, Debug)]
pub struct Context {
    /// The exact command line.
    pub command: String,
    /// UTC date and time.
    pub date: String,
    pub machine: String,
}

/// The whole report.
pub fn markdown(ctx: &Context, results: &[WorkloadResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Routing quality: kvgate's strategies side by side\n");
    let _ = writeln!(
        s,
        "Written by `kvgate-loadbench` (`crates/kvgate-bench`); the chart beside this \
         file (`routing.svg`) comes from the same run.\n"
    );
    let _ = writeln!(s, "- Command: `{}`", ctx.command);
    let _ = writeln!(s, "- Date: {}", ctx.date);
    let _ = writeln!(s, "- Machine: {}\n", ctx.machine);
    let _ = writeln!(
        s,
        "Every (workload, strategy) run gets a fresh fleet of `kvgate-sim` instances \
         with cold caches and a fresh kvgate gateway, all in one process on 127.0.0.1, \
         driven over HTTP with `stream: true`. KV hit rate is the instances' own \
         cached ÷ prompt tokens; *ceiling* is the hit rate of the same requests sent \
         one at a time to a single instance with an infinite cache. TTFT is the \
         client's time to the first SSE chunk, in simulated time (real ÷ time_scale, \
         so the real overheads of HTTP, the gateway and this shared machine count \
         1/time_scale times over); *engine* TTFT is the instances' own \
         `vllm:time_to_first_token_seconds` histogram (simulated clock, merged over the fleet, \
         bucket-interpolated), i.e. the same requests without those overheads. Throughput: completed requests and output tokens \
         per simulated second from the first send to the last completion (arrivals \
         are open-loop, so it tracks the offered load unless the fleet falls \
         behind). Shares: each instance's share of requests. Overflow / spread and \
         fallback: the gateway's `kvgate_routing_decisions_total` for the run's \
         endpoint; *overflow / spread* counts requests sent away from the instance \
         holding the most of their prefix (`overflow` for `prefix_aware`, whose key's \
         instance was full; `cache_spread` for `longest_prefix`, where a less-cached \
         instance was cheaper). \
         Routing time: the gateway's `kvgate_routing_decision_seconds` (real time, \
         bucket-interpolated). `prefix_aware_unbounded` is `prefix_aware` with the same \
         settings but no balance factor (plain consistent hashing up to \
         concurrency_threshold): what the balance factor costs in hits and buys in \
         balance. `longest_prefix` routes by the longest prefix each instance holds in \
         the gateway's own block index (sized by `cache_tokens` to the instances' KV \
         cache), weighed against the prefill queued there; every other setting is the \
         gateway's default for it (concurrency_threshold 256, balance_factor 1.5, \
         block_chars 256, max_prompt_blocks 1024).\n"
    );
    for w in results {
        workload(&mut s, w);
    }
    s
}

fn workload(s: &mut String, w: &WorkloadResult) {
    let _ = writeln!(s, "## {}\n", w.title());
    let _ = writeln!(s, "{}\n", w.description);
    let r = w.routing;
    let _ = writeln!(
        s,
        "KV cache: {} blocks of {} tokens = {} tokens an instance{}.{} \
         `prefix_aware` settings: prefix_length {}, concurrency_threshold {}, \
         balance_factor {}. `longest_prefix`: cache_tokens {}, otherwise its defaults. \
         time_scale {}. Ceiling (one infinite cache, these {} requests): {:.1}%.{}\n",
        w.cache_blocks,
        w.block_size,
        w.cache_tokens(),
        if w.is_cache_scaled() {
            format!(" ({}× the workload's own)", w.cache_scale)
        } else {
            String::new()
        },
        w.max_partial_prefills.map_or_else(String::new, |n| format!(
            " Instances prefill at most {n} request{} at a time (max_partial_prefills).",
            if n == 1 { "" } else { "s" }
        )),
        r.prefix_length,
        r.concurrency_threshold,
        r.balance_factor
            .map_or_else(|| "none".to_owned(), |c| c.to_string()),
        w.cache_tokens(),
        w.time_scale,
        w.requests,
        100.0 * w.ceiling,
        w.trace_ceiling.map_or_else(String::new, |c| format!(
            " Published ceiling of the whole trace: {:.1}%.",
            100.0 * c
        )),
    );
    let trace_col = w.trace_ceiling.is_some();
    let _ = writeln!(
        s,
        "| strategy | KV hit | of ceiling |{} P50 TTFT | P90 TTFT | engine P50 / P90 | req/s | \
         out tok/s | instance shares (%) | overflow / spread | fallback | routing µs (mean / p99) | \
         failed |",
        if trace_col { " of trace ceiling |" } else { "" }
    );
    let _ = writeln!(
        s,
        "|---|---|---|{}---|---|---|---|---|---|---|---|---|---|",
        if trace_col { "---|" } else { "" }
    );
    for run in &w.runs {
        row(s, w, run, trace_col);
    }
    let _ = writeln!(s);
    for run in w.runs.iter().filter(|r| r.hit_by_turn.is_some()) {
        if let Some([a, b, c]) = run.hit_by_turn {
            let _ = writeln!(
                s,
                "- `{}` hit rate by turn: first {:.1}%, second {:.1}%, third and later {:.1}%",
                run.arm.label(),
                100.0 * a,
                100.0 * b,
                100.0 * c
            );
        }
    }
    if w.runs.iter().any(|r| r.hit_by_turn.is_some()) {
        let _ = writeln!(s);
    }
    compare(s, w);
}

fn row(s: &mut String, w: &WorkloadResult, r: &RunResult, trace_col: bool) {
    let shares: Vec<String> = r
        .shares
        .iter()
        .map(|x| format!("{:.1}", 100.0 * x))
        .collect();
    let trace = match (trace_col, w.trace_ceiling) {
        (true, Some(c)) => format!(" {:.0}% |", 100.0 * r.hit_rate / c),
        _ => String::new(),
    };
    let micros = |x: Option<f64>| x.map_or_else(|| "–".to_owned(), |v| format!("{:.0}", 1e6 * v));
    let _ = writeln!(
        s,
        "| {} | {:.1}% | {:.0}% |{} {} | {} | {} / {} | {:.2} | {:.0} | {} | {} | {} | {} / {} | {} |",
        r.arm.label(),
        100.0 * r.hit_rate,
        100.0 * r.hit_rate / w.ceiling.max(1e-9),
        trace,
        ms(r.ttft_p50),
        ms(r.ttft_p90),
        r.engine_ttft_p50.map_or_else(|| "–".to_owned(), ms),
        r.engine_ttft_p90.map_or_else(|| "–".to_owned(), ms),
        r.requests_per_s,
        r.output_tokens_per_s,
        shares.join(" "),
        r.moved(),
        r.decisions_of("fallback"),
        micros(r.routing_mean),
        micros(r.routing_p99),
        r.failed,
    );
}

fn ms(secs: f64) -> String {
    if secs >= 10.0 {
        format!("{secs:.1} s")
    } else {
        format!("{:.0} ms", 1000.0 * secs)
    }
}

/// Each cache-aware arm against `random`, `longest_prefix` against
/// `prefix_aware`, and workload 1's targets.
fn compare(s: &mut String, w: &WorkloadResult) {
    against_random(s, w);
    longest_against_prefix_aware(s, w);
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
            100.0 * p.hit_rate / w.ceiling.max(1e-9),
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
        100.0 * l.hit_rate / w.ceiling.max(1e-9),
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
fn spread(r: &RunResult) -> f64 {
    let even = 1.0 / r.shares.len().max(1) as f64;
    r.shares
        .iter()
        .map(|x| (x - even).abs())
        .fold(0.0, f64::max)
}
