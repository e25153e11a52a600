//! From an arm's records and samples to the report's figures: per tenant
//! TTFT percentiles, fates and tokens served a second inside the
//! measurement window; the fleet's saturation; and the service gap between
//! two tenants over the intervals in which both were backlogged.

use super::arm::{ArmRun, Record};
use super::client::Fate;
use super::sampler::Sample;
use crate::run::percentile;

/// The simulated seconds `[from, to)` the figures are taken over (after a
/// warm-up, before the arrivals stop).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub from: f64,
    pub to: f64,
}

impl Window {
    pub fn len(&self) -> f64 {
        (self.to - self.from).max(1e-9)
    }

    fn overlap(&self, a: f64, b: f64) -> f64 {
        (b.min(self.to) - a.max(self.from)).max(0.0)
    }
}

/// One tenant in one arm; times in simulated seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantFigures {
    /// Requests sent inside the window, and how they ended.
    pub sent: usize,
    pub served: usize,
    pub refused: usize,
    /// Of those, refused within a simulated second of sending (the queue
    /// full), not after waiting.
    pub refused_at_once: usize,
    pub cut_off: usize,
    pub failed: usize,
    /// Over the window's requests that got a first token or were cut off
    /// (counted as infinitely late): refused ones have no TTFT.
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    /// Of the served: P50 and P90 of the time to the response's headers,
    /// that is the wait in the gateway (the rest of the TTFT is the engine's).
    pub held_p50: f64,
    pub held_p90: f64,
    /// Tokens served a second inside the window: each prompt at its first
    /// token, each answer's tokens spread evenly from first token to end.
    pub prompt_per_s: f64,
    pub output_per_s: f64,
}

impl TenantFigures {
    pub fn tokens_per_s(&self) -> f64 {
        self.prompt_per_s + self.output_per_s
    }

    /// Weighted service a second, VTC's way.
    pub fn service_per_s(&self, input_weight: f64, output_weight: f64) -> f64 {
        input_weight * self.prompt_per_s + output_weight * self.output_per_s
    }
}

/// `tenant`'s figures in `run` over `w`; `scale`: real seconds a simulated one.
pub fn tenant(run: &ArmRun, tenant: usize, w: Window, scale: f64) -> TenantFigures {
    let sim = |d: std::time::Duration| d.as_secs_f64() / scale.max(1e-9);
    let mine: Vec<&Record> = run.records.iter().filter(|r| r.tenant == tenant).collect();
    let mut f = TenantFigures::default();
    let mut ttfts = Vec::new();
    let mut held = Vec::new();
    for r in mine.iter().filter(|r| r.sent >= w.from && r.sent < w.to) {
        f.sent += 1;
        match &r.outcome.fate {
            Fate::Served => f.served += 1,
            Fate::Refused(_) => {
                f.refused += 1;
                if sim(r.outcome.total) < 1.0 {
                    f.refused_at_once += 1;
                }
            }
            Fate::CutOff => f.cut_off += 1,
            Fate::Failed(_) => f.failed += 1,
        }
        match (&r.outcome.fate, r.outcome.ttft) {
            (Fate::CutOff, _) => ttfts.push(f64::INFINITY),
            (Fate::Served, Some(t)) => {
                ttfts.push(sim(t));
                held.extend(r.outcome.headers.map(sim));
            }
            _ => {}
        }
    }
    ttfts.sort_by(f64::total_cmp);
    f.ttft_p50 = percentile(&ttfts, 0.5);
    f.ttft_p90 = percentile(&ttfts, 0.9);
    held.sort_by(f64::total_cmp);
    f.held_p50 = percentile(&held, 0.5);
    f.held_p90 = percentile(&held, 0.9);
    // Service inside the window, from every request whatever its sending time.
    let (mut prompt, mut output) = (0.0, 0.0);
    for r in mine.iter().filter(|r| r.outcome.fate == Fate::Served) {
        let Some(ttft) = r.outcome.ttft else { continue };
        let first = r.sent + sim(ttft);
        let end = r.sent + sim(r.outcome.total);
        if (w.from..w.to).contains(&first) {
            prompt += r.outcome.prompt_tokens as f64;
        }
        let out = r.outcome.completion_tokens as f64;
        output += if end > first {
            out * w.overlap(first, end) / (end - first)
        } else if (w.from..w.to).contains(&end) {
            out
        } else {
            0.0
        };
    }
    f.prompt_per_s = prompt / w.len();
    f.output_per_s = output / w.len();
    f
}

/// How loaded the fleet was inside the window: means of the samples, and
/// the tokens it processed a second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Saturation {
    pub engine_running: f64,
    pub engine_waiting: f64,
    pub kv_usage: f64,
    pub gateway_waiting: f64,
    /// Prompt tokens admitted plus output tokens generated a second, fleet-wide.
    pub tokens_per_s: f64,
}

pub fn saturation(samples: &[Sample], w: Window) -> Saturation {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t >= w.from && s.t <= w.to)
        .collect();
    let n = inside.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Sample) -> f64| inside.iter().map(|s| f(s)).sum::<f64>() / n;
    let tokens_per_s = match (inside.first(), inside.last()) {
        (Some(a), Some(b)) if b.t > a.t => (b.engine_tokens - a.engine_tokens) as f64 / (b.t - a.t),
        _ => 0.0,
    };
    Saturation {
        engine_running: mean(&|s| s.engine_running as f64),
        engine_waiting: mean(&|s| s.engine_waiting as f64),
        kv_usage: mean(&|s| s.kv_usage),
        gateway_waiting: mean(&|s| s.waiting.iter().sum()),
        tokens_per_s,
    }
}

/// When a tenant had a request waiting in the gateway, from its client's
/// side: each request from its sending to its response's headers (the
/// gateway sends them once the request is released and the engine has
/// taken it; a refused one's come with the refusal), merged. A request that
/// passed straight through is in it for a few milliseconds only.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Backlog(Vec<(f64, f64)>);

impl Backlog {
    pub fn of(run: &ArmRun, tenant: usize, scale: f64) -> Self {
        let sim = |d: std::time::Duration| d.as_secs_f64() / scale.max(1e-9);
        let mut spans: Vec<(f64, f64)> = run
            .records
            .iter()
            .filter(|r| r.tenant == tenant)
            .map(|r| {
                (
                    r.sent,
                    r.sent + sim(r.outcome.headers.unwrap_or(r.outcome.total)),
                )
            })
            .collect();
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut merged: Vec<(f64, f64)> = Vec::with_capacity(spans.len());
        for (from, to) in spans {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        Self(merged)
    }

    /// Whether some request waited throughout `[from, to]`.
    pub fn covers(&self, from: f64, to: f64) -> bool {
        let i = self.0.partition_point(|s| s.0 <= from);
        i > 0 && self.0.get(i - 1).is_some_and(|s| s.1 >= to)
    }
}

/// The service gap between tenants `ia` and `ib` (weighted service as the
/// gateway counts it, `samples`' `service`) over the intervals between two
/// samples in which both were backlogged throughout (`a`, `b`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gap {
    /// Samples in the window, and those at which both were backlogged.
    pub samples: usize,
    pub both_backlogged: usize,
    /// Sample intervals (pairs) in which both were backlogged throughout.
    pub intervals: usize,
    /// Largest |Δservice(a) − Δservice(b)| over such an interval.
    pub max_gap: f64,
    /// Its interval, simulated seconds.
    pub at: (f64, f64),
}

/// The simulated seconds `[k, k + 1)` in which the gateway released more
/// than `per_second` requests (all tenants; a release is a response's
/// headers, a refusal's included), in order: a mass release drains queues
/// faster than a client or a sample a second can follow.
pub fn mass_releases(run: &ArmRun, scale: f64, per_second: f64) -> Vec<f64> {
    let mut seconds: Vec<i64> = run
        .records
        .iter()
        .filter_map(|r| {
            let h = r.outcome.headers?;
            // `as` saturates; simulated seconds are small.
            Some((r.sent + h.as_secs_f64() / scale.max(1e-9)).floor() as i64)
        })
        .collect();
    seconds.sort_unstable();
    let mut out = Vec::new();
    for chunk in seconds.chunk_by(|a, b| a == b) {
        if chunk.len() as f64 > per_second {
            out.extend(chunk.first().map(|&k| k as f64));
        }
    }
    out
}

/// [`gap`] over the pairs of samples whose interval holds none of the
/// seconds in `avoid` ([`mass_releases`]).
pub fn gap(
    samples: &[Sample],
    a: &Backlog,
    b: &Backlog,
    (ia, ib): (usize, usize),
    w: Window,
    avoid: &[f64],
) -> Gap {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t >= w.from && s.t <= w.to)
        .collect();
    let both = |from: f64, to: f64| a.covers(from, to) && b.covers(from, to);
    let mut g = Gap {
        samples: inside.len(),
        both_backlogged: inside.iter().filter(|s| both(s.t, s.t)).count(),
        ..Gap::default()
    };
    let diff = |s: &Sample| s.service[ia] - s.service[ib];
    for (i, x) in inside.iter().enumerate() {
        for y in inside.iter().skip(i + 1) {
            // Backlog spans are merged, so once one is broken it stays broken.
            if !both(x.t, y.t) {
                break;
            }
            if avoid.iter().any(|&k| k < y.t && k + 1.0 > x.t) {
                continue;
            }
            g.intervals += 1;
            let d = (diff(y) - diff(x)).abs();
            if d > g.max_gap {
                (g.max_gap, g.at) = (d, (x.t, y.t));
            }
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fairness::arm::Kind;
    use crate::fairness::client::Outcome;

    fn record(tenant: usize, sent: f64, ttft: f64, total: f64, fate: Fate) -> Record {
        Record {
            tenant,
            sent,
            outcome: Outcome {
                headers: None,
                ttft: (fate == Fate::Served).then(|| Duration::from_secs_f64(ttft)),
                total: Duration::from_secs_f64(total),
                prompt_tokens: 100,
                completion_tokens: 10,
                fate,
            },
        }
    }

    fn run(records: Vec<Record>, samples: Vec<Sample>) -> ArmRun {
        ArmRun {
            kind: Kind::FloodQueueOn,
            records,
            samples,
            gateway_cpu: 0.0,
            wall: Duration::ZERO,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn tenant_figures_count_fates_percentiles_and_tokens_in_the_window() {
        let w = Window {
            from: 10.0,
            to: 20.0,
        };
        let r = run(
            vec![
                record(1, 5.0, 1.0, 2.0, Fate::Served),  // before the window
                record(1, 11.0, 0.5, 4.0, Fate::Served), // first token at 12, ends at 19
                record(1, 12.0, 1.5, 2.0, Fate::Served), // first token at 15, ends at 16
                record(1, 18.0, 1.0, 6.0, Fate::Served), // first token at 20: outside
                record(1, 13.0, 0.0, 30.0, Fate::Refused(429)),
                record(1, 14.0, 0.0, 60.0, Fate::CutOff),
                record(0, 12.0, 0.1, 1.0, Fate::Served), // another tenant's
            ],
            Vec::new(),
        );
        // Real seconds are half simulated ones.
        let f = tenant(&r, 1, w, 0.5);
        assert_eq!((f.sent, f.served, f.refused, f.cut_off), (5, 3, 1, 1));
        assert_eq!(f.refused_at_once, 0, "refused after 60 simulated seconds");
        // TTFTs 1, 3, 2 (simulated) and the cut-off at infinity.
        assert_eq!(f.ttft_p50, 2.0);
        assert_eq!(f.ttft_p90, f64::INFINITY);
        // Prompts at 12, 15 and 20 (outside): 2 × 100 over 10 s.
        assert!((f.prompt_per_s - 20.0).abs() < 1e-9, "{}", f.prompt_per_s);
        // Outputs: the first two's 10 each, the third's all after the window.
        assert!((f.output_per_s - 2.0).abs() < 1e-9, "{}", f.output_per_s);
    }

    #[test]
    fn the_gap_is_taken_only_where_both_were_backlogged() {
        let s = |t: f64, fa: f64, fb: f64, wa: f64, wb: f64| Sample {
            t,
            service: [fa, fb, 0.0],
            waiting: [wa, wb, 0.0],
            ..Sample::default()
        };
        let samples = vec![
            s(0.0, 0.0, 0.0, 1.0, 0.0),
            s(1.0, 5_000.0, 0.0, 1.0, 0.0), // b idle: a may run ahead
            s(2.0, 6_000.0, 1_000.0, 3.0, 2.0),
            s(3.0, 7_000.0, 1_500.0, 3.0, 1.0),
            s(4.0, 7_200.0, 2_900.0, 3.0, 1.0),
            s(5.0, 9_000.0, 3_000.0, 3.0, 0.0),
        ];
        // a waits all along; b from 1.5 to 4.2 (two requests, one span).
        let a = Backlog(vec![(0.0, 6.0)]);
        let b = Backlog::of(
            &run(
                vec![
                    record(1, 1.5, 0.0, 0.0, Fate::Refused(429)),
                    record(1, 2.5, 0.0, 0.0, Fate::Refused(429)),
                ]
                .into_iter()
                .zip([1.0, 1.7])
                .map(|(mut r, h)| {
                    r.outcome.headers = Some(Duration::from_secs_f64(h));
                    r
                })
                .collect(),
                Vec::new(),
            ),
            1,
            1.0,
        );
        assert_eq!(b, Backlog(vec![(1.5, 4.2)]));
        assert!(b.covers(2.0, 4.0) && !b.covers(1.0, 2.0) && !b.covers(4.0, 5.0));
        let w = Window {
            from: 0.0,
            to: 10.0,
        };
        let g = gap(&samples, &a, &b, (0, 1), w, &[]);
        assert_eq!((g.samples, g.both_backlogged, g.intervals), (6, 3, 3));
        // From t = 3 to 4: a +200, b +1,400.
        assert_eq!(g.max_gap, 1_200.0);
        assert_eq!(g.at, (3.0, 4.0));
        // Without the second [3, 4): only 2 → 3.
        let g = gap(&samples, &a, &b, (0, 1), w, &[3.0]);
        assert_eq!((g.intervals, g.max_gap, g.at), (1, 500.0, (2.0, 3.0)));
        let released = |sent: f64, h: f64| {
            let mut r = record(0, sent, 0.0, h, Fate::Refused(429));
            r.outcome.headers = Some(Duration::from_secs_f64(h));
            r
        };
        let burst = run(
            vec![
                released(0.0, 3.2),
                released(1.0, 2.5),
                released(2.0, 1.9),
                released(0.5, 0.1),
            ],
            Vec::new(),
        );
        assert_eq!(mass_releases(&burst, 1.0, 2.0), [3.0]);
        assert!(mass_releases(&burst, 1.0, 3.0).is_empty());
        let sat = saturation(&samples, Window { from: 1.0, to: 4.0 });
        assert!((sat.gateway_waiting - 3.5).abs() < 1e-9);
    }
}
