//! The report's later sections: the service gap over time, the gateway's
//! CPU, failures and warnings, and the samples as CSV.

use std::fmt::Write as _;

use super::arm::{ArmRun, Kind};
use super::results::{MASS_RELEASE, Results, bound_u, gap_figure};
use super::tenants::{FLOOD, STEADY, VIP};

pub(super) fn service_over_time(s: &mut String, r: &Results<'_>) {
    let Some(run) = r.run(Kind::FloodQueueOn) else {
        return;
    };
    let q = &r.opts.queue;
    let u = bound_u(r);
    let Some((g, calm, bursts)) = r.gap() else {
        return;
    };
    let _ = writeln!(
        s,
        "## Service between the backlogged tenants (queue on)\n\n\
         `kvgate_tenant_service_total` (weighted service, `{}`·prompt + `{}`·output tokens, as the \
         gateway charges it: the prompt when a request is released, the output when it ends) and \
         `kvgate_queue_waiting`, read from the gateway's `/metrics` every simulated second. The \
         bound is VTC's (Sheng et al., OSDI '24, Theorem 4.2): over any interval in which two \
         tenants are both backlogged their service differs by at most 2·U, U = `input_weight`·L_in \
         + `output_weight`·L_out for the largest request = {}·{:.0} + {}·{:.0} = {:.0}, so **2·U = \
         {:.0}**. *Backlogged*: from its client's side, the tenant had a request waiting \
         throughout (each request counts from its sending to its response's headers, which the \
         gateway sends once it has released it and the engine has taken it); the gap is taken \
         between any two samples with both backlogged all the time between them. VTC counts \
         output tokens as they are generated; the gateway charges a request's output when its \
         answer ends, so over a short interval the counters can also differ by output generated \
         before it (at most the output of everything in flight).\n",
        q.input_weight,
        q.output_weight,
        q.input_weight,
        r.opts.sizes.prompt_range.1,
        q.output_weight,
        r.opts.sizes.output_range.1,
        u,
        2.0 * u,
    );
    let _ = writeln!(
        s,
        "Both backlogged at {} of {} samples of the window; {} pairs of samples with both \
         backlogged all the time between; the largest gap over one: {}. A mass release (more \
         than {MASS_RELEASE}× the fleet's estimated capacity released in one simulated second: \
         the gateway let a backlog go at once) can drain a tenant's queue within it faster \
         than its client sees (releases reach the clients over a fraction of a second, and the \
         tenant's next arrivals bridge the gap), so such an interval may count as backlogged \
         though one queue was empty for an instant. Seconds with a mass release: {}; over the \
         {} pairs whose interval holds none of them, the largest gap: {}.\n",
        g.both_backlogged,
        g.samples,
        g.intervals,
        gap_figure(&g),
        if bursts.is_empty() {
            "none".to_owned()
        } else {
            bursts
                .iter()
                .map(|k| format!("{k:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        calm.intervals,
        gap_figure(&calm),
    );
    let _ = writeln!(
        s,
        "Every 10 s (cumulative service since the start; waiting: requests in the queue at \
         that moment):\n\n\
         | t (s) | `flood` | `steady` | `vip` | `flood` − `steady` | waiting `flood` / `steady` / `vip` | engines running / waiting |\n\
         |---|---|---|---|---|---|---|"
    );
    let mut next = 0.0;
    for x in &run.samples {
        if x.t + 1e-6 < next {
            continue;
        }
        next += 10.0;
        let _ = writeln!(
            s,
            "| {:.0} | {:.0} | {:.0} | {:.0} | {:+.0} | {:.0} / {:.0} / {:.0} | {} / {} |",
            x.t,
            x.service[FLOOD],
            x.service[STEADY],
            x.service[VIP],
            x.service[FLOOD] - x.service[STEADY],
            x.waiting[FLOOD],
            x.waiting[STEADY],
            x.waiting[VIP],
            x.engine_running,
            x.engine_waiting,
        );
    }
    let _ = writeln!(s);
}

pub(super) fn cpu(s: &mut String, r: &Results<'_>) {
    let _ = writeln!(
        s,
        "## The gateway's CPU\n\nutime + stime of the gateway process (`/proc/PID/stat`) from \
         the first arrival to the last answer, over the requests it was sent (refused and cut \
         off ones included), over those it served, and over the output tokens it streamed (a \
         streamed token is most of a served request's cost: the arms serve different mixes).\n"
    );
    let _ = writeln!(
        s,
        "| arm | CPU s | requests | served | output tokens | CPU ms / request | CPU ms / served \
         request | CPU µs / output token |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for run in r.runs {
        let n = run.records.len();
        let served = run
            .records
            .iter()
            .filter(|x| x.outcome.fate == super::client::Fate::Served)
            .count();
        let tokens: u64 = run
            .records
            .iter()
            .filter(|x| x.outcome.fate == super::client::Fate::Served)
            .map(|x| x.outcome.completion_tokens)
            .sum();
        let _ = writeln!(
            s,
            "| {} | {:.2} | {} | {} | {} | {:.3} | {:.3} | {:.1} |",
            run.kind.label(),
            run.gateway_cpu,
            n,
            served,
            tokens,
            1e3 * run.gateway_cpu / n.max(1) as f64,
            1e3 * run.gateway_cpu / served.max(1) as f64,
            1e6 * run.gateway_cpu / tokens.max(1) as f64,
        );
    }
    let _ = writeln!(s);
}

pub(super) fn warnings(s: &mut String, r: &Results<'_>) {
    let total: usize = r.runs.iter().map(|x| x.warnings.len()).sum();
    let failed: Vec<String> = r
        .runs
        .iter()
        .flat_map(|run| {
            run.records
                .iter()
                .filter_map(move |x| match &x.outcome.fate {
                    super::client::Fate::Failed(e) => Some(format!("{}: {e}", run.kind.label())),
                    _ => None,
                })
        })
        .collect();
    if total == 0 && failed.is_empty() {
        return;
    }
    let _ = writeln!(s, "## Failures and gateway warnings\n");
    if !failed.is_empty() {
        let _ = writeln!(
            s,
            "{} request(s) failed; the first: `{}`\n",
            failed.len(),
            failed[0]
        );
    }
    for run in r.runs.iter().filter(|x| !x.warnings.is_empty()) {
        let _ = writeln!(
            s,
            "{}: {} WARN/ERROR line(s) in the gateway's log; the first: `{}`\n",
            run.kind.label(),
            run.warnings.len(),
            run.warnings[0].chars().take(300).collect::<String>()
        );
    }
}

/// Every arm's samples: one line each.
pub fn samples_csv(runs: &[ArmRun]) -> String {
    let mut s = "arm,t,service_flood,service_steady,service_vip,waiting_flood,waiting_steady,\
                 waiting_vip,engine_running,engine_waiting,kv_usage,engine_tokens,gateway_cpu\n"
        .to_owned();
    for run in runs {
        for x in &run.samples {
            let _ = writeln!(
                s,
                "{},{:.2},{},{},{},{},{},{},{},{},{:.3},{},{:.2}",
                run.kind.label(),
                x.t,
                x.service[0],
                x.service[1],
                x.service[2],
                x.waiting[0],
                x.waiting[1],
                x.waiting[2],
                x.engine_running,
                x.engine_waiting,
                x.kv_usage,
                x.engine_tokens,
                x.gateway_cpu
            );
        }
    }
    s
}
