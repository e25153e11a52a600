//! `kvgate-loadbench fairness --replicas 1,2,4`: the flood with the queue on
//! behind each count of gateway replicas (each its own process, sharing their
//! tenants' service through one Redis, each sent every n-th request), against
//! one gateway: does a flood spread over replicas get more than its share,
//! and does the service gap between two backlogged tenants keep VTC's bound
//! across the fleet? Into `replicas-fairness.md`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;

use super::arm::{self, ArmRun, Kind};
use super::results::{Results, bound_u, gap_figure};
use super::tenants::{FLOOD, STEADY, TENANTS, VIP};
use super::{Args, Options};
use crate::report::Context;

/// Every count's run, then the report.
pub async fn run(
    args: &Args,
    ctx: &Context,
    opts: &Options,
    requests: &[super::tenants::Request],
    (capacity, fair_share): (f64, f64),
    build: String,
) -> anyhow::Result<PathBuf> {
    if args.replicas.contains(&0) {
        anyhow::bail!("--replicas must be at least 1");
    }
    // The fleet's saturated throughput, queue off, one gateway: the capacity
    // `steady` and `vip` leave to the flood is measured against it.
    let off = arm::run(opts, Kind::FloodQueueOff, requests).await?;
    eprintln!("  {}", super::report::progress_line(opts, &off));
    let mut runs = Vec::new();
    for &n in &args.replicas {
        let o = Options {
            replicas: n,
            ..opts.clone()
        };
        let on = arm::run(&o, Kind::FloodQueueOn, requests).await?;
        eprintln!(
            "  {n} replica(s): {}",
            super::report::progress_line(&o, &on)
        );
        runs.push((n, on));
    }
    let saturated = super::stats::saturation(&off.samples, opts.window()).tokens_per_s;
    let bound = 2.0 * bound_u(&results(opts, capacity, fair_share, &[]));
    let mut s = String::new();
    let _ = writeln!(s, "# Fair queueing behind several gateway replicas\n");
    let _ = writeln!(s, "- Command: `{}`", ctx.command);
    let _ = writeln!(s, "- Date: {}", ctx.date);
    let _ = writeln!(s, "- Machine: {}", ctx.machine);
    let _ = writeln!(s, "- Build: {build}\n");
    let _ = writeln!(
        s,
        "The flood scenario of `fairness.md` (`flood` at 5× its fair share, `steady` and `vip` \
         (high priority) at theirs, open loop, {} instances saturated; fair share {fair_share:.2} \
         requests a simulated second of an estimated {capacity:.1}), with the queue on behind R \
         gateway replicas: each its own `kvgate serve` process, every request to the next \
         replica, replicas sharing each tenant's service through one fresh `redis-server` \
         (`cluster.sync_ms: {}`, real ms; none at R = 1). Service is each replica's \
         `kvgate_tenant_service_total` summed once a simulated second. The gap is \
         `fairness.md`'s: the largest difference between `flood`'s and `steady`'s service \
         growth over an interval in which both were backlogged, against VTC's 2·U = {:.0}. \
         *Flood's share* is its tokens a second of what the fleet's saturated throughput \
         (queue off, one gateway: {:.0} tokens/s) leaves after `steady` and `vip`.\n",
        opts.instances,
        crate::fleet::SHARING.0,
        bound,
        saturated,
    );
    let _ = writeln!(
        s,
        "| replicas | flood tok/s | steady tok/s | vip tok/s | flood's share | steady P90 TTFT | \
         vip P90 TTFT | largest flood–steady gap | within 2·U | refused (f/s/v) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for (n, on) in &runs {
        let pair = [off.clone(), on.clone()];
        let r = results(opts, capacity, fair_share, &pair);
        let f = |t| r.figures(Kind::FloodQueueOn, t).unwrap_or_default();
        let (flood, steady, vip) = (f(FLOOD), f(STEADY), f(VIP));
        let left = (saturated - steady.tokens_per_s() - vip.tokens_per_s()).max(1e-9);
        let (gap, verdict) = match r.gap() {
            Some((g, _, _)) if g.intervals > 0 => {
                let ok = g.max_gap <= bound;
                (gap_figure(&g), if ok { "yes" } else { "**no**" })
            }
            Some((g, _, _)) => (gap_figure(&g), "not measured"),
            None => ("–".to_owned(), "not measured"),
        };
        let _ = writeln!(
            s,
            "| {n} | {:.0} | {:.0} | {:.0} | {:.0}% | {} | {} | {gap} | {verdict} | {}/{}/{} |",
            flood.tokens_per_s(),
            steady.tokens_per_s(),
            vip.tokens_per_s(),
            100.0 * flood.tokens_per_s() / left,
            secs(steady.ttft_p90),
            secs(vip.ttft_p90),
            flood.refused,
            steady.refused,
            vip.refused,
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "Tenants: {}.",
        TENANTS
            .iter()
            .map(|t| t.name)
            .collect::<Vec<_>>()
            .join(", ")
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join(if args.quick {
        "replicas-fairness-quick.md"
    } else {
        "replicas-fairness.md"
    });
    std::fs::write(&path, s)?;
    Ok(path)
}

fn results<'a>(
    opts: &'a Options,
    capacity_estimate: f64,
    fair_share: f64,
    runs: &'a [ArmRun],
) -> Results<'a> {
    Results {
        opts,
        capacity_estimate,
        fair_share,
        runs,
        build: String::new(),
    }
}

/// `1.23 s`, or `cut off` for a P90 beyond the cap.
fn secs(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2} s")
    } else {
        "cut off".to_owned()
    }
}
