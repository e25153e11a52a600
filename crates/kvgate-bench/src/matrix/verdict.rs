//! Issue 20's dominance test of a cache-aware strategy against `prefix_aware`
//! in one cell: engine-cached prompt tokens within 1 point, P90 TTFT at most
//! 5% worse, throughput at most 3% worse.
//!
//! TTFT is judged on the instances' own clock (each request's time from its
//! arrival at the engine to its first token, or to its last when the cell does
//! not stream, exact percentiles): the client's time also holds the real
//! overheads of HTTP, the gateway and the load generator on this shared
//! machine, multiplied by 1/time_scale (100× at 0.01), which would judge the
//! benchmark's compression of time, not the routing. The client-side figure
//! is reported beside it, and judged too ([`Verdict::client_ttft`]), so a
//! reader sees where the two disagree. Throughput likewise: completed
//! requests per simulated second on the instances' clock
//! ([`crate::readback::engine_throughput`]: each client or session replayed
//! on the instances' end-to-end times and its think times; in the closed
//! loop the longest client's sum of end-to-end times), the client's own
//! figure beside it and judged in [`Verdict::client_throughput`].

use crate::{Arm, RunResult, WorkloadResult};

/// Hit rate may fall this far below `prefix_aware`'s (a fraction: 1 point).
pub const HIT_SLACK: f64 = 0.01;
/// P90 TTFT may be at most this multiple of `prefix_aware`'s.
pub const TTFT_FACTOR: f64 = 1.05;
/// Throughput must be at least this multiple of `prefix_aware`'s.
pub const THROUGHPUT_FACTOR: f64 = 0.97;

/// The strategies judged, each against `prefix_aware`.
pub const JUDGED: [Arm; 2] = [Arm::LongestPrefix, Arm::KvAware];

/// One strategy's result in one cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub arm: Arm,
    pub hit: bool,
    pub ttft: bool,
    pub throughput: bool,
    /// The TTFT criterion on the client's P90 instead (not counted).
    pub client_ttft: bool,
    /// The throughput criterion on the client's req/s instead (not counted).
    pub client_throughput: bool,
}

impl Verdict {
    pub fn won(&self) -> bool {
        self.hit && self.ttft && self.throughput
    }

    /// The criteria it failed, by name.
    pub fn failed(&self) -> Vec<&'static str> {
        [
            (self.hit, "hit"),
            (self.ttft, "P90 TTFT"),
            (self.throughput, "throughput"),
        ]
        .into_iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, name)| name)
        .collect()
    }
}

/// P90 TTFT on the engines' clock: to the first token, or to the whole
/// answer when the cell does not stream.
pub fn engine_p90(w: &WorkloadResult, r: &RunResult) -> f64 {
    if w.regime.stream {
        r.engine_ttft_exact.1
    } else {
        r.engine_e2e.1
    }
}

/// P50 of the same.
pub fn engine_p50(w: &WorkloadResult, r: &RunResult) -> f64 {
    if w.regime.stream {
        r.engine_ttft_exact.0
    } else {
        r.engine_e2e.0
    }
}

/// Requests per second on the instances' clock (the client's when the
/// instances' logs missed a request).
pub fn throughput(r: &RunResult) -> f64 {
    r.engine_requests_per_s.unwrap_or(r.requests_per_s)
}

/// The `prefix_aware` run `arm` is judged against in `w`: on the same kind
/// of instances where that ran ([`Arm::baseline`]).
pub fn baseline(w: &WorkloadResult, arm: Arm) -> Option<&RunResult> {
    let ran: Vec<Arm> = w.runs.iter().map(|r| r.arm).collect();
    w.run(arm.baseline(&ran))
}

/// Each judged strategy that ran in `w`, against its `prefix_aware` run
/// (none when that did not run).
pub fn judge(w: &WorkloadResult) -> Vec<Verdict> {
    JUDGED
        .iter()
        .filter_map(|&arm| Some((w.run(arm)?, baseline(w, arm)?)))
        .map(|(r, base)| Verdict {
            arm: r.arm,
            hit: r.hit_rate >= base.hit_rate - HIT_SLACK - 1e-12,
            ttft: engine_p90(w, r) <= TTFT_FACTOR * engine_p90(w, base) + 1e-12,
            throughput: throughput(r) >= THROUGHPUT_FACTOR * throughput(base) - 1e-12,
            client_ttft: r.ttft_p90 <= TTFT_FACTOR * base.ttft_p90 + 1e-12,
            client_throughput: r.requests_per_s >= THROUGHPUT_FACTOR * base.requests_per_s - 1e-12,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_criteria_name_what_failed() {
        let v = Verdict {
            arm: Arm::KvAware,
            hit: true,
            ttft: false,
            throughput: false,
            client_ttft: true,
            client_throughput: true,
        };
        assert!(!v.won());
        assert_eq!(v.failed(), ["P90 TTFT", "throughput"]);
    }
}
