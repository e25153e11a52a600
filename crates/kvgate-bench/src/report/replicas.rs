//! `replicas.md`: one workload under each arm at 1, 2, 4 … gateway replicas
//! behind a round-robin balancer, to show which strategies keep their hit
//! rate when no single gateway sees every request.

use std::fmt::Write as _;

use super::{Context, ms};
use crate::{Arm, WorkloadResult};

/// The report; `results` holds one entry a (workload, replica count).
pub fn markdown(ctx: &Context, results: &[WorkloadResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Routing quality behind several gateway replicas\n");
    let _ = writeln!(
        s,
        "Written by `kvgate-loadbench --replicas …` (`crates/kvgate-bench`).\n"
    );
    let _ = writeln!(s, "- Command: `{}`", ctx.command);
    let _ = writeln!(s, "- Date: {}", ctx.date);
    let _ = writeln!(s, "- Machine: {}\n", ctx.machine);
    let _ = writeln!(
        s,
        "Each run starts N replicas of the gateway, each its own `kvgate serve` process \
         (the same config, the same fresh simulated fleet), sharing one fresh \
         `redis-server` through `cluster` (`sync_ms: {sync}`, engine readings every \
         {poll} ms, real time), and the load generator sends every request to the next \
         replica in turn, as a round-robin balancer in front of them would, so \
         consecutive turns of one conversation reach different replicas. Replicas share \
         their per-instance in-flight counts, queued prefill and recent work, and \
         `longest_prefix` its placements (see the README's *Several replicas*); \
         `kv_aware` replicas all subscribe to every instance's KV events. KV hit rate, \
         ceiling, TTFT and shares are measured as in `routing.md` (`kv_aware`'s \
         instances count SmolLM2 tokens, the others 4-byte chunks: hit rates are ratios, \
         and each arm's *of ceiling* is against the ceiling counted its own way). *Peak* \
         is the most requests any one instance had running and waiting at once, sampled \
         every 10 ms; *Redis a request* is the commands and bytes (in + out) Redis \
         handled over the run divided by its requests. Every figure in a row comes from \
         one run.\n",
        sync = crate::fleet::SHARING.0,
        poll = crate::fleet::SHARING.1,
    );
    let mut ids: Vec<&str> = Vec::new();
    for w in results {
        if !ids.contains(&w.setup_id.as_str()) {
            ids.push(&w.setup_id);
        }
    }
    for id in ids {
        let of_id: Vec<&WorkloadResult> = results.iter().filter(|w| w.setup_id == id).collect();
        table(&mut s, id, &of_id);
    }
    s
}

fn table(s: &mut String, id: &str, results: &[&WorkloadResult]) {
    let _ = writeln!(s, "## {id}\n");
    if let Some(w) = results.first() {
        let _ = writeln!(
            s,
            "{}\n\nKV cache: {} tokens an instance. time_scale {}.\n",
            w.description,
            w.cache_tokens(),
            w.time_scale
        );
    }
    let _ = writeln!(
        s,
        "| strategy | replicas | KV hit | of ceiling | P50 TTFT | P90 TTFT | engine P50 / P90 | \
         instance shares (%) | peak in flight | cache_spread | Redis a request | failed |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut arms: Vec<Arm> = Vec::new();
    for w in results {
        for r in &w.runs {
            if !arms.contains(&r.arm) {
                arms.push(r.arm);
            }
        }
    }
    for &arm in &arms {
        for w in results {
            let Some(r) = w.run(arm) else { continue };
            let shares: Vec<String> = r
                .shares
                .iter()
                .map(|x| format!("{:.1}", 100.0 * x))
                .collect();
            let _ = writeln!(
                s,
                "| {} | {} | {:.1}% | {:.1}% | {} | {} | {} / {} | {} | {} | {} | {} | {} |",
                arm.label(),
                w.gateways,
                100.0 * r.hit_rate,
                100.0 * w.of_ceiling(r),
                ms(r.ttft_p50),
                ms(r.ttft_p90),
                r.engine_ttft_p50.map_or_else(|| "–".to_owned(), ms),
                r.engine_ttft_p90.map_or_else(|| "–".to_owned(), ms),
                shares.join(" "),
                r.peak_in_flight.iter().max().copied().unwrap_or(0),
                r.decisions_of("cache_spread"),
                redis_per_request(r),
                r.failed,
            );
        }
    }
    let _ = writeln!(s);
    for &arm in &arms {
        let runs: Vec<String> = results
            .iter()
            .filter_map(|w| w.run(arm).map(|r| (w, r)))
            .map(|(w, r)| {
                format!(
                    "{} replica{}: {:.1}%",
                    w.gateways,
                    if w.gateways == 1 { "" } else { "s" },
                    100.0 * w.of_ceiling(r)
                )
            })
            .collect();
        let _ = writeln!(s, "- `{}` of ceiling: {}", arm.label(), runs.join(", "));
    }
    let _ = writeln!(s);
}

/// Redis commands and bytes a request, e.g. `3.1 cmd, 1.2 KB`.
fn redis_per_request(r: &crate::RunResult) -> String {
    match r.redis {
        Some(t) if r.requests > 0 => {
            let n = r.requests as f64;
            format!(
                "{:.1} cmd, {:.1} KB",
                t.commands as f64 / n,
                (t.bytes_in + t.bytes_out) as f64 / n / 1e3
            )
        }
        _ => "–".to_owned(),
    }
}
