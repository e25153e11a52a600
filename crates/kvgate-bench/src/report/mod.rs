//! The Markdown report: how it was run, then a table per workload and the
//! comparisons under it (`compare.rs`); `replicas.rs` writes the replica table.

use std::fmt::Write as _;

mod compare;
pub mod replicas;

use crate::{Regime, RunResult, WorkloadResult};

use compare::compare;

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
    // Only a run given `--arrivals`, `--stream` or `--capacity` says so.
    if let Some(w) = results.iter().find(|w| w.regime != Regime::default()) {
        let _ = writeln!(
            s,
            "- **Regime: {}** (the text below describes the default, open · stream · \
             capacity configured; without `stream`, TTFT is the time to the whole answer)\n",
            w.regime
        );
    }
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
         block_chars 256, max_prompt_blocks 1024). `kv_aware` places requests \
         as `longest_prefix` does, on what each instance's KV events (ZeroMQ, as vLLM \
         publishes them) say it holds, by real token ids: its gateway tokenizes each prompt \
         with SmolLM2's tokenizer and chat template, and so do its instances, which then \
         count SmolLM2 tokens where every other arm's count 4-byte chunks. Its hit rate is \
         a ratio of tokens counted one way, so it stays comparable, and its *of ceiling* \
         is against the ceiling counted the same way (the same bodies on an infinite \
         cache that tokenizes); its cache, though, is the same number of tokens, which \
         holds less text when text takes more tokens (see the ratio under each table). \
         Before a `kv_aware` run each instance is sent small probes directly until the \
         gateway has heard its events; the probes are left out of every figure.\n"
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
         time_scale {}.{} Ceiling (one infinite cache, these {} requests): {:.1}%{}.{}\n",
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
        if (w.kv_token_ratio - 1.0).abs() > 1e-9 {
            format!(
                " `kv_aware`'s instances (`--kv-token-ratio {}`): KV blocks, prefill rate and \
                 step budget {}× the others', so they hold and prefill as much text.",
                w.kv_token_ratio, w.kv_token_ratio
            )
        } else {
            String::new()
        },
        w.requests,
        100.0 * w.ceiling,
        w.token_ceiling.map_or_else(String::new, |c| format!(
            " ({:.1}% in SmolLM2 tokens, for `kv_aware`)",
            100.0 * c
        )),
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
        100.0 * w.of_ceiling(r),
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

pub fn ms(secs: f64) -> String {
    if secs >= 10.0 {
        format!("{secs:.1} s")
    } else {
        format!("{:.0} ms", 1000.0 * secs)
    }
}
