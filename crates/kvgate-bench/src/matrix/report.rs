//! `matrix.md`: how it was run, the summary (cells won and lost per
//! strategy, and every losing cell with the criterion it failed), then each
//! workload's cells, a table and a verdict each.

use std::fmt::Write as _;

use super::verdict::{self, HIT_SLACK, THROUGHPUT_FACTOR, TTFT_FACTOR, Verdict};
use crate::report::Context;
use crate::{RunResult, WorkloadResult};

/// The whole report over `cells` (in run order); `build` names the source
/// ([`crate::host::build`], taken when the run started).
pub fn markdown(ctx: &Context, build: &str, cells: &[WorkloadResult], elapsed_s: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Routing under load regimes: the matrix\n");
    let dense = cells.iter().any(|w| !w.density.is_english());
    let _ = writeln!(
        s,
        "Written by `kvgate-loadbench --matrix` (`crates/kvgate-bench`, `src/matrix/`), for \
         issue 20{}.\n",
        if dense {
            ", with issue 30's text densities (`--density`)"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "- Command: `{}`", ctx.command);
    let _ = writeln!(s, "- Date: {}", ctx.date);
    let _ = writeln!(s, "- Machine: {}", ctx.machine);
    let _ = writeln!(s, "- Build: {build}");
    let _ = writeln!(
        s,
        "- Cells: {}; wall time {:.1} min; load average (1, 5, 15 min) at the end: {}\n",
        cells.len(),
        elapsed_s / 60.0,
        load_average()
    );
    method(&mut s);
    if dense {
        super::density::method(&mut s);
    }
    sizes(&mut s, cells);
    super::summary::summary(&mut s, cells);
    super::summary::by_workload(&mut s, cells);
    if dense {
        super::density::side_by_side(&mut s, cells);
    }
    let mut last = String::new();
    for w in cells {
        if w.workload_label() != last {
            last = w.workload_label();
            let _ = writeln!(s, "## {last}\n\n{}\n", w.description);
            if !w.density.is_english() {
                super::density::cell_note(&mut s, w);
            }
        }
        cell(&mut s, w, dense);
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
         count those tokens; the others count 4-byte chunks). The same text is more \
         tokens on `kv_aware`'s instances (about 1.0× for documents and traces, up to 1.12× \
         for chat: the chat template's tokens), so they get that many times the KV blocks \
         (over whole prompts) and the prefill rate and step budget (over the text a cache \
         that never evicts still prefills), measured in each cell by replaying \
         `prefix_aware`'s bodies both ways (the line under each cell's table): each arm's \
         engines hold and prefill the same text in the same time. Runs before 2026-12-06 did not, and a \
         `kv_aware` P90 a few percent above `prefix_aware`'s at equal hit rates, on chat, \
         was that. That scaling is an average: a request whose new text is denser in \
         SmolLM2 tokens (a chat turn's template and answer) still prefills longer there. \
         So *prefix_aware_tokens* is `prefix_aware` (the same settings) on `kv_aware`'s \
         own instances, tokenizing and scaled alike, and `kv_aware` is judged against it \
         (since 2026-12-07; before, against `prefix_aware` on the 4-byte instances). Its client columns also hold the tokenizing, in the gateway and in \
         every instance, on 2 shared cores, magnified by 1/time_scale.\n"
    );
    let _ = writeln!(
        s,
        "Columns: *KV hit* is the instances' own cached ÷ prompt tokens. *P50 / P90* are \
         each request's time from its arrival at an instance to its first token (to its \
         last in no-stream cells), on the simulated clock, exact. *client P90* is the same \
         as the client saw it (time to the first SSE chunk, or to the whole answer), which \
         also holds the real overheads of HTTP, the gateway and this shared 2-core machine \
         magnified by 1/time_scale. *req/s*: completed requests per simulated second on the \
         instances' clock, those overheads taken out: each client (closed loop) or session \
         (open) is replayed from its start, each of its requests after its think time for \
         its end-to-end time on its instance, and the span runs to the last one's end — in \
         the closed loop the longest client's sum of end-to-end times, i.e. the wall time of \
         the same work; *client req/s*: the client's own, first send to last answer, where \
         every overhead also delays a session's next turn. *shares*: the \
         least and most loaded instance's share of requests; *idle*: instances that got \
         none.\n"
    );
    let _ = writeln!(
        s,
        "Verdict (issue 20's dominance), each cache-aware strategy against `prefix_aware` in \
         the same cell, on the same kind of instances (`longest_prefix` against \
         `prefix_aware`, `kv_aware` against `prefix_aware_tokens`): KV hit ≥ `prefix_aware`'s − {:.0} point, P90 ≤ {:.2}× \
         `prefix_aware`'s (on the instances' clock; `verdict.rs` says why), req/s ≥ {:.2}× \
         `prefix_aware`'s. A cell is won only when all three hold.\n",
        100.0 * HIT_SLACK,
        TTFT_FACTOR,
        THROUGHPUT_FACTOR
    );
}

/// One row a workload: what every one of its cells sends, and on what.
fn sizes(s: &mut String, cells: &[WorkloadResult]) {
    let _ = writeln!(
        s,
        "Sizes (each workload's section says more; `routing.md` runs the same workloads \
         larger, on 7 instances, open loop only). One run a cell and strategy, so P90s of \
         ~100–400 requests move by several percent from run to run: a verdict near a \
         threshold is a coin toss.\n"
    );
    let _ = writeln!(
        s,
        "| workload | requests | instances | KV cache an instance (tokens) | time_scale | \
         prefill at once |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    let mut seen: Vec<&str> = Vec::new();
    for w in cells {
        if seen.contains(&w.setup_id.as_str()) {
            continue;
        }
        seen.push(&w.setup_id);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            w.setup_id,
            w.requests,
            w.instances,
            w.cache_tokens(),
            w.time_scale,
            w.max_partial_prefills
                .map_or_else(|| "any".to_owned(), |n| n.to_string()),
        );
    }
    let _ = writeln!(s);
}

fn cell(s: &mut String, w: &WorkloadResult, dense: bool) {
    let what = if w.regime.stream {
        "TTFT"
    } else {
        "latency (whole answer)"
    };
    let _ = writeln!(s, "### {} · {}\n", w.workload_label(), w.regime);
    let learned = if dense {
        " gateway's bytes/token |"
    } else {
        ""
    };
    let _ = writeln!(
        s,
        "| strategy | KV hit | P50 {what} | P90 {what} | client P90 | req/s | client req/s | shares min–max (%) | idle | failed |{learned} verdict |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|{}---|",
        if dense { "---|" } else { "" }
    );
    let verdicts = verdict::judge(w);
    for r in &w.runs {
        let v = verdicts.iter().find(|v| v.arm == r.arm);
        let learned = dense.then(|| super::density::learned(r));
        row(s, w, r, v, learned);
    }
    let _ = writeln!(s);
    if w.density.is_english() && w.runs.iter().any(|r| r.arm.tokenizing()) {
        let _ = writeln!(
            s,
            "`kv_aware`'s and `prefix_aware_tokens`' instances: {:.3} SmolLM2 tokens a 4-byte chunk of these prompts ({:.3} of the text prefilled), and that many times the KV blocks (the prefill rate).\n",
            w.kv_token_ratio, w.kv_prefill_ratio
        );
    }
}

/// One arm's row; `learned`: the gateway's learned density column, when shown.
fn row(
    s: &mut String,
    w: &WorkloadResult,
    r: &RunResult,
    v: Option<&Verdict>,
    learned: Option<String>,
) {
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
        "| {} | {:.1}% | {} | {} | {} | {:.2} | {:.2} | {:.1}–{:.1} | {} | {} |{} {} |",
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
        learned.map(|l| format!(" {l} |")).unwrap_or_default(),
        verdict,
    );
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn ms(secs: f64) -> String {
    crate::report::ms(secs)
}
