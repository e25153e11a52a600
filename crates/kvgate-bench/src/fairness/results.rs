//! What the fairness report is written from ([`Results`]): the arms' runs and
//! the figures taken from them, which [`super::report`] and
//! [`super::sections`] both write out.

use super::Options;
use super::arm::{ArmRun, Kind};
use super::stats::{self, Saturation, TenantFigures};
use super::tenants::{FLOOD, STEADY};

/// A second in which the gateway released more than this many times the
/// fleet's capacity a second holds a mass release.
pub(super) const MASS_RELEASE: f64 = 4.0;

/// What the report is written from.
pub struct Results<'a> {
    pub opts: &'a Options,
    pub capacity_estimate: f64,
    pub fair_share: f64,
    pub runs: &'a [ArmRun],
    pub build: String,
}

impl Results<'_> {
    pub(super) fn run(&self, kind: Kind) -> Option<&ArmRun> {
        self.runs.iter().find(|r| r.kind == kind)
    }

    pub(super) fn figures(&self, kind: Kind, tenant: usize) -> Option<TenantFigures> {
        let scale = self.opts.sim.time_scale;
        self.run(kind)
            .filter(|r| r.kind.sends(tenant))
            .map(|r| stats::tenant(r, tenant, self.opts.window(), scale))
    }

    pub(super) fn unloaded(&self, tenant: usize) -> Option<TenantFigures> {
        self.figures(Kind::Alone(tenant), tenant)
    }

    /// `flood` against `steady` with the queue on: over every interval both
    /// were backlogged, and over those without a mass release (the
    /// seconds that had one).
    pub(super) fn gap(&self) -> Option<(stats::Gap, stats::Gap, Vec<f64>)> {
        let run = self.run(Kind::FloodQueueOn)?;
        let scale = self.opts.sim.time_scale;
        let (a, b) = (
            stats::Backlog::of(run, FLOOD, scale),
            stats::Backlog::of(run, STEADY, scale),
        );
        let w = self.opts.window();
        let pair = (FLOOD, STEADY);
        let bursts = stats::mass_releases(run, scale, MASS_RELEASE * self.capacity_estimate);
        Some((
            stats::gap(&run.samples, &a, &b, pair, w, &[]),
            stats::gap(&run.samples, &a, &b, pair, w, &bursts),
            bursts,
        ))
    }

    pub(super) fn saturation(&self, kind: Kind) -> Option<Saturation> {
        self.run(kind)
            .map(|r| stats::saturation(&r.samples, self.opts.window()))
    }
}

/// `**12345** (40–52 s)`, or that there was no interval to measure.
pub(super) fn gap_figure(g: &stats::Gap) -> String {
    if g.intervals == 0 {
        "none measured (never backlogged together from one sample to the next)".to_owned()
    } else {
        format!("**{:.0}** ({:.0}–{:.0} s)", g.max_gap, g.at.0, g.at.1)
    }
}

/// VTC's `U`: the largest weighted cost a request of the workload can have.
pub(super) fn bound_u(r: &Results<'_>) -> f64 {
    let q = &r.opts.queue;
    r.opts.sizes.max_cost(q.input_weight, q.output_weight)
}
