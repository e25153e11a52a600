//! `matrix.md`: how it was run, the summary (cells won and lost per
//! strategy, and every losing cell with the criterion it failed), then each
//! workload's cells, a table and a verdict each.

use std::fmt::Write as _;

use super::verdict::{self, HIT_SLACK, JUDGED, THROUGHPUT_FACTOR, TTFT_FACTOR, Verdict};
use crate::report::Context;
use crate::{RunResult, WorkloadResult};

/// The whole report over `cells` (in run order).
pub fn markdown(ctx: &Context, cells: &[WorkloadResult], elapsed_s: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Routing under load regimes: the matrix\n");
    let _ = writeln!(
        s,
        "Written by `kvgate-loadbench --matrix` (`crates/kvgate-bench`, `src/matrix/`), for \
         issue 20.\n"
    );
    let _ = writeln!(s, "- Command: `{}`", ctx.command);
    let _ = writeln!(s, "- Date: {}", ctx.date);
    let _ = writeln!(s, "- Machine: {}", ctx.machine);
    let _ = writeln!(
        s,
        "- Cells: {}; wall time {:.1} min\n",
        cells.len(),
        elapsed_s / 60.0
    );
    method(&mut s);
    summary(&mut s, cells);
    let mut last = "";
    for w in cells {
        if w.setup_id != last {
            let _ = writeln!(s, "## {}\n\n{}\n", w.setup_id, w.description);
            last = &w.setup_id;
        }
        cell(&mut s, w);
    }
    s
}

fn method(s: &mut String) {
    let _ = writeln!(
        s,
        "Every (workload, regime, strategy) run gets a fresh fleet of `kvgate-sim` instances \
         with cold caches and a fresh gateway, all in one process on 127.0.0.1, driven over \
         HTTP. Regimes: *open* is `routing.md`'s open loop (sessions start at their Poisson \
         times, with think times); *closed:N* is N clients, each sending its next request \
         when its last one answers: a client plays one session at a time to its end, with \
         no think time, then takes the next (`closed.rs` says why), so fewer than N are in \
         flight once fewer sessions are left. *stream* sends `stream: true`; *no-stream* \
         `stream: false`, where the client sees only the whole answer, so every TTFT of a \
         no-stream cell is the **time to the whole answer** (latency). *capacity learned*: \
         no `cache_tokens` in the gateway's config, the instances export \
         `vllm:cache_config_info` and the run starts once the gateway has learned it; \
         *capacity unknown*: no `cache_tokens` and no gauge, so `longest_prefix` and \
         `kv_aware` assume the gateway's default of 384,000 tokens an instance. \
         `prefix_aware` runs on the workload's `routing.md` settings; `longest_prefix` and \
         `kv_aware` on their defaults (`kv_aware`'s instances tokenize with SmolLM2 and \
         count those tokens; the others count 4-byte chunks).\n"
    );
    let _ = writeln!(
        s,
        "Columns: *KV hit* is the instances' own cached ÷ prompt tokens. *P50 / P90* are \
         each request's time from its arrival at an instance to its first token (to its \
         last in no-stream cells), on the simulated clock, exact. *client P90* is the same \
         as the client saw it (time to the first SSE chunk, or to the whole answer), which \
         also holds the real overheads of HTTP, the gateway and this shared 2-core machine \
         magnified by 1/time_scale. *req/s*: completed requests per simulated second on the \
         instances' clock, those overheads taken out (closed loop: the longest client's sum \
         of its requests' end-to-end times on the instances, i.e. the wall time of the same \
         work; open: first send to the last answer's end on the instance); *client req/s*: \
         the client's own, first send to last answer. *shares*: the \
         least and most loaded instance's share of requests; *idle*: instances that got \
         none.\n"
    );
    let _ = writeln!(
        s,
        "Verdict (issue 20's dominance), each cache-aware strategy against `prefix_aware` in \
         the same cell: KV hit ≥ `prefix_aware`'s − {:.0} point, P90 ≤ {:.2}× \
         `prefix_aware`'s (on the instances' clock; `verdict.rs` says why), req/s ≥ {:.2}× \
         `prefix_aware`'s. A cell is won only when all three hold.\n",
        100.0 * HIT_SLACK,
        TTFT_FACTOR,
        THROUGHPUT_FACTOR
    );
}

fn summary(s: &mut String, cells: &[WorkloadResult]) {
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(
        s,
        "| strategy | cells | won | lost | lost on hit | on P90 TTFT | on throughput | on the client's P90 / req/s instead (not counted) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    let judged: Vec<(&WorkloadResult, Verdict)> = cells
        .iter()
        .flat_map(|w| verdict::judge(w).into_iter().map(move |v| (w, v)))
        .collect();
    for arm in JUDGED {
        let mine: Vec<&Verdict> = judged
            .iter()
            .filter(|(_, v)| v.arm == arm)
            .map(|(_, v)| v)
            .collect();
        let count = |f: fn(&Verdict) -> bool| mine.iter().filter(|v| f(v)).count();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            arm.label(),
            mine.len(),
            count(Verdict::won),
            count(|v| !v.won()),
            count(|v| !v.hit),
            count(|v| !v.ttft),
            count(|v| !v.throughput),
            count(|v| !v.client_ttft),
            count(|v| !v.client_throughput),
        );
    }
    let _ = writeln!(s, "\nLosing cells:\n");
    let mut any = false;
    for (w, v) in judged.iter().filter(|(_, v)| !v.won()) {
        any = true;
        let (Some(base), Some(r)) = (w.run(crate::Arm::PrefixAware), w.run(v.arm)) else {
            continue;
        };
        let _ = writeln!(
            s,
            "- {} · {} — `{}` lost on {}: hit {:.1}% vs {:.1}%, P90 {} vs {}, {:.2} vs {:.2} req/s",
            w.setup_id,
            w.regime,
            v.arm.label(),
            v.failed().join(", "),
            100.0 * r.hit_rate,
            100.0 * base.hit_rate,
            ms(verdict::engine_p90(w, r)),
            ms(verdict::engine_p90(w, base)),
            verdict::throughput(r),
            verdict::throughput(base),
        );
    }
    if !any {
        let _ = writeln!(s, "- none");
    }
    let _ = writeln!(s);
}

fn cell(s: &mut String, w: &WorkloadResult) {
    let what = if w.regime.stream {
        "TTFT"
    } else {
        "latency (whole answer)"
    };
    let _ = writeln!(s, "### {} · {}\n", w.setup_id, w.regime);
    let _ = writeln!(
        s,
        "| strategy | KV hit | P50 {what} | P90 {what} | client P90 | req/s | client req/s | shares min–max (%) | idle | failed | verdict |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    let verdicts = verdict::judge(w);
    for r in &w.runs {
        let v = verdicts.iter().find(|v| v.arm == r.arm);
        row(s, w, r, v);
    }
    let _ = writeln!(s);
}

fn row(s: &mut String, w: &WorkloadResult, r: &RunResult, v: Option<&Verdict>) {
    let lo = r.shares.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = r.shares.iter().copied().fold(0.0, f64::max);
    let idle = r.shares.iter().filter(|&&x| x == 0.0).count();
    let verdict = match v {
        None => "–".to_owned(),
        Some(v) if v.won() => "won".to_owned(),
        Some(v) => format!("**lost**: {}", v.failed().join(", ")),
    };
    let _ = writeln!(
        s,
        "| {} | {:.1}% | {} | {} | {} | {:.2} | {:.2} | {:.1}–{:.1} | {} | {} | {} |",
        r.arm.label(),
        100.0 * r.hit_rate,
        ms(verdict::engine_p50(w, r)),
        ms(verdict::engine_p90(w, r)),
        ms(r.ttft_p90),
        verdict::throughput(r),
        r.requests_per_s,
        100.0 * if lo.is_finite() { lo } else { 0.0 },
        100.0 * hi,
        idle,
        r.failed,
        verdict,
    );
}

fn ms(secs: f64) -> String {
    crate::report::ms(secs)
}
