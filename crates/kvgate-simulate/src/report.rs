//! The sweep's results as a text table with the recommendation, or as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::engine::RunStats;
use super::recommend::{Recommendation, TIE_BAND};
use super::sweep::{Fleet, Setting};

/// The trace and its ceilings.
#[derive(Debug, Clone, Serialize)]
pub struct TraceSummary {
    pub path: String,
    pub requests: usize,
    /// Seconds from first to last arrival, before the speed-up.
    pub duration_s: f64,
    /// Share of trace blocks seen before (infinite cache): Mooncake's figure.
    pub ceiling_blocks: f64,
    /// Share of prompt tokens an infinite cache would serve: the hit rate's own measure.
    pub ceiling_tokens: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub setting: Setting,
    #[serde(flatten)]
    pub stats: RunStats,
    /// Hit rate over `ceiling_tokens`.
    pub of_ceiling: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub trace: TraceSummary,
    pub fleet: Fleet,
    pub rows: Vec<Row>,
    pub recommendation: Option<Recommendation>,
    /// Wall-clock seconds the sweep took, and on how many threads.
    pub elapsed_s: f64,
    pub threads: usize,
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn opt(v: Option<usize>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn signed_pct(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".to_owned(), |x| format!("{:+.0}%", x * 100.0))
}

fn kilo(v: Option<usize>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{}k", v / 1000))
}

/// The config keys of a setting, as they would be written.
fn describe(setting: &Setting) -> String {
    let mut out = format!("strategy {}", setting.strategy.as_str());
    let keys = [
        ("prefix_length", setting.prefix_length),
        ("block_chars", setting.block_chars),
        ("cache_tokens", setting.cache_tokens),
        ("concurrency_threshold", setting.concurrency_threshold),
    ];
    for (name, v) in keys {
        if let Some(v) = v {
            let _ = write!(out, ", {name} {v}");
        }
    }
    out
}

/// The human-readable report.
pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let t = &r.trace;
    let f = &r.fleet;
    let tm = &f.timing;
    let _ = writeln!(
        s,
        "trace {}: {} requests over {:.0} s, replayed {}x faster ({:.0} s)",
        t.path,
        t.requests,
        t.duration_s,
        f.speedup,
        t.duration_s / f.speedup
    );
    let _ = writeln!(
        s,
        "ceiling (infinite cache): {} of trace blocks reused, {} of prompt tokens (the hit rate's measure)",
        pct(t.ceiling_blocks),
        pct(t.ceiling_tokens)
    );
    let _ = writeln!(
        s,
        "fleet: {} instances x {} KV blocks of {} tokens ({}k tokens); prefill {:.0} tok/s, \
         ITL {:.0} ms, max {} running, {} tokens a step; {} vnodes{}",
        f.instances,
        tm.cache_blocks,
        tm.block_size,
        tm.cache_blocks * tm.block_size / 1000,
        tm.prefill_tokens_per_s,
        tm.inter_token_latency_s * 1e3,
        tm.max_running,
        tm.max_batched_tokens,
        f.virtual_nodes,
        f.balance_factor
            .map_or_else(String::new, |c| format!(", balance factor {c}"))
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<27} {:>6} {:>6} {:>5} {:>5} {:>6} {:>7} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8} {:>6}",
        "strategy",
        "prefix",
        "thresh",
        "block",
        "cache",
        "hit",
        "of ceil",
        "TTFT mean",
        "P50",
        "P90",
        "P99",
        "max sh",
        "overflow",
        "spread"
    );
    for row in &r.rows {
        let st = &row.stats;
        let _ = writeln!(
            s,
            "{:<27} {:>6} {:>6} {:>5} {:>5} {:>6} {:>7} {:>9.0} {:>8.0} {:>8.0} {:>8.0} {:>6} {:>8} {:>6}",
            row.setting.strategy.as_str(),
            opt(row.setting.prefix_length),
            opt(row.setting.concurrency_threshold),
            opt(row.setting.block_chars),
            kilo(row.setting.cache_tokens),
            pct(st.hit_rate),
            pct(row.of_ceiling),
            st.ttft_mean_ms,
            st.ttft_p50_ms,
            st.ttft_p90_ms,
            st.ttft_p99_ms,
            pct(st.max_share),
            pct(st.overflow),
            if row.setting.strategy.uses_index() {
                pct(st.spread)
            } else {
                "-".to_owned()
            }
        );
    }
    let _ = writeln!(
        s,
        "(TTFT in ms; block = block_chars and cache = the cache_tokens the gateway assumes, longest_prefix; \
         max sh = busiest instance's share of requests; overflow = placed off the preferred instance, \
         or every instance full; spread = placed off the instance holding most of the prompt, its queue being longer)"
    );
    let rejected: usize = r
        .rows
        .iter()
        .map(|row| row.stats.rejected)
        .max()
        .unwrap_or(0);
    if rejected > 0 {
        let _ = writeln!(
            s,
            "warning: up to {rejected} requests did not fit an empty instance's cache and were dropped"
        );
    }
    let _ = writeln!(s);
    match r
        .recommendation
        .as_ref()
        .and_then(|rec| Some((rec, r.rows.get(rec.index)?)))
    {
        Some((rec, row)) => {
            let st = &row.stats;
            let _ = writeln!(s, "recommended: {}", describe(&row.setting));
            let _ = writeln!(
                s,
                "  P50 TTFT {:.0} ms ({} vs random), P90 {:.0} ms ({} vs random), hit rate {} ({} of ceiling), \
                 busiest instance {} (balanced bound {}{})",
                st.ttft_p50_ms,
                signed_pct(rec.p50_vs_random),
                st.ttft_p90_ms,
                signed_pct(rec.p90_vs_random),
                pct(st.hit_rate),
                pct(row.of_ceiling),
                pct(st.max_share),
                pct(rec.max_share_bound),
                if rec.balanced {
                    ""
                } else {
                    "; NOT met by any setting"
                }
            );
            if let Some(other) = rec.best_other.and_then(|i| r.rows.get(i)) {
                let _ = writeln!(
                    s,
                    "  against {}, the best other strategy: P50 {}, P90 {}",
                    other.setting.strategy.as_str(),
                    signed_pct(rec.p50_vs_best_other),
                    signed_pct(rec.p90_vs_best_other)
                );
            }
            if let Some((alt, lp)) = rec
                .longest_prefix
                .as_ref()
                .and_then(|a| Some((a, r.rows.get(a.index)?)))
            {
                longest_lines(&mut s, alt, lp, row);
            }
            let _ = writeln!(
                s,
                "  rule: least P50 + P90 TTFT among a strategy's settings within the bound \
                 (prefix_aware recommended, longest_prefix beside it); within {:.0}% of it, the higher hit rate",
                TIE_BAND * 100.0
            );
        }
        None => {
            let _ = writeln!(s, "recommended: nothing (no settings were run)");
        }
    }
    let _ = writeln!(
        s,
        "simulated {} settings in {:.2} s on {} threads",
        r.rows.len(),
        r.elapsed_s,
        r.threads
    );
    s
}

/// The best longest_prefix setting and how it compares with `rec`, the recommended one.
fn longest_lines(s: &mut String, alt: &super::recommend::Alternative, lp: &Row, rec: &Row) {
    let st = &lp.stats;
    let _ = writeln!(s, "best longest_prefix: {}", describe(&lp.setting));
    let _ = writeln!(
        s,
        "  P50 TTFT {:.0} ms ({} vs random), P90 {:.0} ms ({} vs random), hit rate {} ({} of ceiling; \
         the index believed {}), busiest instance {}{}, spread {}, cold {}",
        st.ttft_p50_ms,
        signed_pct(alt.p50_vs_random),
        st.ttft_p90_ms,
        signed_pct(alt.p90_vs_random),
        pct(st.hit_rate),
        pct(lp.of_ceiling),
        pct(st.believed_hit),
        pct(st.max_share),
        if alt.balanced { "" } else { " (bound NOT met)" },
        pct(st.spread),
        pct(st.cold)
    );
    let _ = writeln!(
        s,
        "  against the recommended {} setting: P50 {}, P90 {}, hit rate {:+.1} points",
        rec.setting.strategy.as_str(),
        signed_pct(alt.p50_vs_recommended),
        signed_pct(alt.p90_vs_recommended),
        alt.hit_vs_recommended * 100.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::Timing;
    use kvgate_routing::Strategy;

    fn stats(p50: f64, hit: f64) -> RunStats {
        RunStats {
            requests: 10,
            rejected: 0,
            hit_rate: hit,
            ttft_mean_ms: 120.0,
            ttft_p50_ms: p50,
            ttft_p90_ms: 2.0 * p50,
            ttft_p99_ms: 300.0,
            shares: vec![0.5, 0.5],
            max_share: 0.5,
            overflow: 0.1,
            spread: 0.05,
            cold: 0.2,
            believed_hit: 0.35,
            makespan_s: 5.0,
        }
    }

    #[test]
    fn text_names_the_recommendation_and_json_round_trips() {
        let aware = Setting {
            prefix_length: Some(4096),
            concurrency_threshold: Some(8),
            ..Setting::plain(Strategy::PrefixAware)
        };
        let longest = Setting {
            concurrency_threshold: Some(256),
            block_chars: Some(256),
            cache_tokens: Some(384_000),
            ..Setting::plain(Strategy::LongestPrefix)
        };
        let report = Report {
            trace: TraceSummary {
                path: "t.jsonl".into(),
                requests: 10,
                duration_s: 9.0,
                ceiling_blocks: 0.4,
                ceiling_tokens: 0.38,
            },
            fleet: Fleet {
                instances: 2,
                timing: Timing::from_sim(&kvgate_sim::SimConfig::default()),
                speedup: 1.0,
                virtual_nodes: 160,
                balance_factor: None,
                max_prompt_blocks: 1024,
            },
            rows: vec![
                Row {
                    setting: aware,
                    stats: stats(100.0, 0.3),
                    of_ceiling: 0.3 / 0.38,
                },
                Row {
                    setting: longest,
                    stats: stats(80.0, 0.34),
                    of_ceiling: 0.34 / 0.38,
                },
            ],
            recommendation: Some(Recommendation {
                index: 0,
                balanced: true,
                max_share_bound: 0.625,
                p50_vs_random: Some(-0.7),
                p90_vs_random: None,
                best_other: None,
                p50_vs_best_other: None,
                p90_vs_best_other: None,
                longest_prefix: Some(crate::recommend::Alternative {
                    index: 1,
                    balanced: true,
                    p50_vs_random: None,
                    p90_vs_random: None,
                    p50_vs_recommended: Some(-0.2),
                    p90_vs_recommended: Some(-0.2),
                    hit_vs_recommended: 0.04,
                }),
            }),
            elapsed_s: 0.1,
            threads: 2,
        };
        let out = text(&report);
        assert!(
            out.contains(
                "recommended: strategy prefix_aware, prefix_length 4096, concurrency_threshold 8"
            ),
            "{out}"
        );
        assert!(out.contains("(-70% vs random)"), "{out}");
        assert!(
            out.contains(
                "best longest_prefix: strategy longest_prefix, block_chars 256, cache_tokens 384000, \
                 concurrency_threshold 256"
            ),
            "{out}"
        );
        assert!(
            out.contains("against the recommended prefix_aware setting: P50 -20%, P90 -20%, hit rate +4.0 points"),
            "{out}"
        );
        assert!(out.contains("the index believed 35.0%"), "{out}");
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["rows"][0]["setting"]["strategy"], "prefix_aware");
        assert_eq!(json["rows"][0]["ttft_p50_ms"], 100.0);
        assert_eq!(json["rows"][1]["setting"]["block_chars"], 256);
        assert_eq!(json["recommendation"]["longest_prefix"]["index"], 1);
    }
}
