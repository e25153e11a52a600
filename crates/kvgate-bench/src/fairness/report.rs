//! `fairness.md`: how it ran, the targets with their figures, per tenant
//! and arm, the fleet's load; then [`super::sections`]' service gap over
//! time and the gateway's CPU.

use std::fmt::Write as _;

use super::arm::{ArmRun, Kind};
use super::results::{Results, bound_u, gap_figure};
use super::stats;
use super::tenants::{FLOOD, STEADY, TENANTS, VIP};
use super::{Options, sections};
use crate::report::Context;

/// The shared target: a well-behaved tenant's P90 within this many times
/// its unloaded P90 while the flood runs.
const WITHIN: f64 = 1.5;
/// "Unaffected" (vip): within this factor, what one run's noise allows.
const UNAFFECTED: f64 = 1.1;
/// Work-conserving: the flood gets at least this share of what others leave.
const CONSERVING: f64 = 0.9;
/// One line a run, for the terminal.
pub fn progress_line(opts: &Options, run: &ArmRun) -> String {
    let mut s = format!("{:<26}", run.kind.label());
    for (i, t) in TENANTS.iter().enumerate() {
        if !run.kind.sends(i) {
            continue;
        }
        let f = stats::tenant(run, i, opts.window(), opts.sim.time_scale);
        let _ = write!(
            s,
            "  {} p90 {} ({} served, {} refused, {} cut off)",
            t.name,
            secs(f.ttft_p90),
            f.served,
            f.refused,
            f.cut_off
        );
    }
    let _ = write!(
        s,
        "  gateway CPU {:.1} s, wall {:.0} s",
        run.gateway_cpu,
        run.wall.as_secs_f64()
    );
    s
}

/// The whole report.
pub fn markdown(ctx: &Context, r: &Results<'_>) -> String {
    let mut s = String::new();
    let o = r.opts;
    let w = o.window();
    let q = &o.queue;
    let (prompt_mean, output_mean) = o.sizes.means();
    let _ = writeln!(
        s,
        "# Fair queueing between tenants on a saturated fleet (issue 22)\n"
    );
    let _ = writeln!(s, "Command: `{}`\n", ctx.command);
    let _ = writeln!(s, "- Date: {}", ctx.date);
    let machine = ctx.machine.replace(
        "gateway, simulators and load generator in one process",
        "simulators and load generator in one process, the gateway in its own",
    );
    let here = std::env::current_dir().unwrap_or_default();
    let bin = r.opts.kvgate.strip_prefix(&here).unwrap_or(&r.opts.kvgate);
    let _ = writeln!(
        s,
        "- Machine: {machine}; the gateway: `{} serve`",
        bin.display()
    );
    let _ = writeln!(s, "- Gateway built from: {}\n", r.build);

    let _ = writeln!(s, "## Setup\n");
    let _ = writeln!(
        s,
        "{} `kvgate-sim` instances, the Llama-3.1-70B / 4×H100 preset ({} KV blocks of {} tokens, \
         {} prefill tokens/s, {} ms a decode step, `max_num_seqs` {}, step budget {} tokens), \
         time scale {} (real seconds a simulated one; every time below is simulated). Estimated \
         capacity: {:.1} requests/s (the instances' prefill rate over a request's mean {:.0} prompt \
         + {:.0} output tokens), so a fair share (a third) is **{:.2} requests/s**.\n",
        o.instances,
        o.sim.cache_blocks,
        o.sim.block_size,
        o.sim.prefill_tokens_per_s,
        o.sim.inter_token_latency.as_millis(),
        o.sim.max_running,
        o.sim.max_batched_tokens,
        o.sim.time_scale,
        r.capacity_estimate,
        prompt_mean,
        output_mean,
        r.fair_share,
    );
    let _ = writeln!(
        s,
        "Tenants, by API key: {}. Each sends open-loop Poisson arrivals for {:.0} s of single-turn \
         streaming chat completions, every prompt unique (no prefix cache hits): prompts \
         log-normal, median {:.0} tokens ({:.0}–{:.0}), answers median {:.0} ({:.0}–{:.0}). \
         `steady` and `vip` send the same requests in every arm. Routing: \
         `least_outstanding_requests`.\n",
        TENANTS
            .iter()
            .enumerate()
            .map(|(i, t)| format!(
                "`{}` ({} priority, {:.2} req/s = {}× its share)",
                t.name,
                t.priority,
                r.fair_share * r.opts.shares[i],
                r.opts.shares[i]
            ))
            .collect::<Vec<_>>()
            .join(", "),
        o.duration.as_secs_f64(),
        o.sizes.prompt_median,
        o.sizes.prompt_range.0,
        o.sizes.prompt_range.1,
        o.sizes.output_median,
        o.sizes.output_range.0,
        o.sizes.output_range.1,
    );
    let _ = writeln!(
        s,
        "Arms, each on a fresh fleet and a fresh gateway: **unloaded** (`steady` alone, then `vip` \
         alone, {}); **flood, queue off** (all three, no `queue` section: today's \
         pass-through); **flood, queue on** (`queue: {{enabled: true, max_in_flight: {}, \
         max_waiting: {}, max_kv_usage: {}, engine_poll_ms: {:.0}, max_length: {}, max_wait_ms: \
         {:.0}, input_weight: {}, output_weight: {}}}`, the durations here simulated; the gateway \
         is given them × the time scale). {}\n",
        if o.unloaded_queue {
            "the queue on as below (`--unloaded-queue`)"
        } else {
            "no `queue` section"
        },
        q.max_in_flight,
        q.max_waiting,
        q.max_kv_usage,
        q.engine_poll.as_secs_f64() * 1e3,
        q.max_length,
        q.max_wait.as_secs_f64() * 1e3,
        q.input_weight,
        q.output_weight,
        knobs_note(o),
    );
    let _ = writeln!(
        s,
        "Figures are over the window {:.0}–{:.0} s (after a warm-up as long as the queue's \
         longest wait): TTFT and fates of the requests *sent* in it, tokens *served* in it (a \
         prompt at its first token, an answer's tokens spread from its first token to its end). \
         TTFT is the client's, from sending to the first SSE chunk, a wait in the gateway \
         included. A request with no first token after {:.0} s is given up by its client (*cut \
         off*, counted as infinitely late in the percentiles); refused requests (429) have no \
         TTFT and are counted apart (*at once*: within a second of sending, the queue full; the \
         others after waiting `max_wait_ms`). One run; the medians are of its requests.\n",
        w.from,
        w.to,
        o.ttft_cap.as_secs_f64(),
    );

    targets(&mut s, r);
    per_tenant(&mut s, r);
    load(&mut s, r);
    sections::service_over_time(&mut s, r);
    sections::cpu(&mut s, r);
    sections::warnings(&mut s, r);
    s
}

fn targets(s: &mut String, r: &Results<'_>) {
    let _ = writeln!(s, "## Targets\n");
    let _ = writeln!(s, "| target | figure | verdict |\n|---|---|---|");
    for (t, limit, what) in [
        (STEADY, WITHIN, format!("within {WITHIN}× of unloaded")),
        (VIP, WITHIN, format!("within {WITHIN}× of unloaded")),
        (
            VIP,
            UNAFFECTED,
            format!("unaffected: within {UNAFFECTED}× of unloaded"),
        ),
    ] {
        let (Some(base), Some(on)) = (r.unloaded(t), r.figures(Kind::FloodQueueOn, t)) else {
            continue;
        };
        let ratio = on.ttft_p90 / base.ttft_p90.max(1e-9);
        let _ = writeln!(
            s,
            "| `{}` P90 TTFT under the flood, queue on, {what} | {} vs {} unloaded: **{}** (queue off: {}) | {} |",
            TENANTS[t].name,
            secs(on.ttft_p90),
            secs(base.ttft_p90),
            times(ratio),
            r.figures(Kind::FloodQueueOff, t).map_or_else(
                || "–".to_owned(),
                |f| times(f.ttft_p90 / base.ttft_p90.max(1e-9))
            ),
            verdict(ratio <= limit),
        );
    }
    if let (Some(on), Some(off)) = (
        r.saturation(Kind::FloodQueueOn),
        r.saturation(Kind::FloodQueueOff),
    ) {
        let others: f64 = [STEADY, VIP]
            .iter()
            .filter_map(|&t| r.figures(Kind::FloodQueueOn, t))
            .map(|f| f.tokens_per_s())
            .sum();
        let flood = r
            .figures(Kind::FloodQueueOn, FLOOD)
            .map_or(0.0, |f| f.tokens_per_s());
        let left = (off.tokens_per_s - others).max(1e-9);
        let share = flood / left;
        let _ = writeln!(
            s,
            "| work-conserving: `flood`'s tokens/s with the queue on, of the capacity `steady` and \
             `vip` leave (capacity: the fleet's tokens/s saturated, queue off) | {:.0} of {:.0} − \
             {:.0} = {:.0}: **{:.0}%**; the fleet processed {:.0} tokens/s queue on, {:.0} off | {} (≥ {:.0}%) |",
            flood,
            off.tokens_per_s,
            others,
            left,
            100.0 * share,
            on.tokens_per_s,
            off.tokens_per_s,
            verdict(share >= CONSERVING),
            100.0 * CONSERVING,
        );
    }
    if let Some((g, calm, bursts)) = r.gap() {
        let bound = 2.0 * bound_u(r);
        let _ = writeln!(
            s,
            "| VTC: `flood` and `steady`'s weighted service (as the gateway counts it) within 2·U \
             of each other over any interval both are backlogged | largest gap {} (bound {:.0}; \
             both backlogged at {} of {} samples); over intervals without a mass release ({} \
             second(s) had one): {} | {} |",
            gap_figure(&g),
            bound,
            g.both_backlogged,
            g.samples,
            bursts.len(),
            gap_figure(&calm),
            if g.intervals == 0 {
                "not measured".to_owned()
            } else if calm.intervals > 0 && calm.max_gap <= bound && g.max_gap > bound {
                format!("{} (met without mass releases)", verdict(false))
            } else {
                verdict(g.max_gap <= bound)
            },
        );
    }
    let _ = writeln!(s);
}

/// Where the queue's knobs come from.
fn knobs_note(o: &Options) -> String {
    let q = &o.queue;
    let mut note = if q.max_in_flight == o.sim.max_running {
        "`max_in_flight` is the instances' own `max_num_seqs`: the gateway would let each \
         engine run a full batch, and the engine's own figures say when it is saturated."
            .to_owned()
    } else {
        format!(
            "`max_in_flight` {} per instance (`--max-in-flight`; the instances' `max_num_seqs` is {}).",
            q.max_in_flight, o.sim.max_running
        )
    };
    if q.max_waiting == 0 && q.engine_poll == std::time::Duration::from_millis(250) {
        note.push_str(" `max_waiting` and `engine_poll_ms` are the gateway's defaults.");
    } else {
        note.push_str(
            " `max_waiting` / `engine_poll_ms` set on the command line (the gateway's defaults: 0 / 250).",
        );
    }
    note
}

fn per_tenant(s: &mut String, r: &Results<'_>) {
    let _ = writeln!(
        s,
        "## Per tenant and arm\n\n*Held in the gateway*: of the served requests, the time to \
         the response's headers (the gateway sends them once it has released the request and \
         the engine has taken it); the rest of the TTFT is the engine's.\n"
    );
    let _ = writeln!(
        s,
        "| arm | tenant | offered req/s | sent | served | refused | cut off | failed | P50 TTFT | \
         P90 TTFT | P90 ÷ unloaded | P50 / P90 held in the gateway | prompt tok/s | output tok/s | \
         weighted service/s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let q = &r.opts.queue;
    for run in r.runs {
        for (i, t) in TENANTS.iter().enumerate() {
            let Some(f) = r.figures(run.kind, i) else {
                continue;
            };
            let vs = r.unloaded(i).map_or_else(
                || "–".to_owned(),
                |b| times(f.ttft_p90 / b.ttft_p90.max(1e-9)),
            );
            let _ = writeln!(
                s,
                "| {} | `{}` | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} / {:.2} s | {:.0} | {:.0} | {:.0} |",
                run.kind.label(),
                t.name,
                r.fair_share * r.opts.shares[i],
                f.sent,
                f.served,
                if f.refused_at_once > 0 {
                    format!("{} ({} at once)", f.refused, f.refused_at_once)
                } else {
                    f.refused.to_string()
                },
                f.cut_off,
                f.failed,
                secs(f.ttft_p50),
                secs(f.ttft_p90),
                vs,
                f.held_p50,
                f.held_p90,
                f.prompt_per_s,
                f.output_per_s,
                f.service_per_s(q.input_weight, q.output_weight),
            );
        }
    }
    let _ = writeln!(s);
}

fn load(s: &mut String, r: &Results<'_>) {
    let _ = writeln!(
        s,
        "## How loaded the fleet was\n\nMeans of the once-a-second samples in the window, over \
         the instances (running and waiting summed, KV use averaged); *tokens/s*: prompt tokens \
         admitted plus output tokens generated, fleet-wide.\n"
    );
    let _ = writeln!(
        s,
        "| arm | engines running | engines waiting | KV use | waiting in the gateway | fleet tokens/s |\n\
         |---|---|---|---|---|---|"
    );
    for run in r.runs {
        let sat = stats::saturation(&run.samples, r.opts.window());
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.1} | {:.0}% | {:.0} | {:.0} |",
            run.kind.label(),
            sat.engine_running,
            sat.engine_waiting,
            100.0 * sat.kv_usage,
            sat.gateway_waiting,
            sat.tokens_per_s,
        );
    }
    let _ = writeln!(s);
}

fn secs(v: f64) -> String {
    if v.is_infinite() {
        "cut off".to_owned()
    } else {
        format!("{v:.2} s")
    }
}

fn times(v: f64) -> String {
    if v.is_infinite() {
        "∞".to_owned()
    } else {
        format!("{v:.2}×")
    }
}

fn verdict(met: bool) -> String {
    if met { "met" } else { "**missed**" }.to_owned()
}
