//! The results of all rounds and the tables made from them: medians over
//! rounds, latency added over the direct path, and ratios to nginx.

use std::collections::HashMap;
use std::fmt::Write;

/// One open-loop cell in one round.
pub struct OpenCell {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub achieved: f64,
    pub errors: usize,
    /// The proxy's CPU µs a completed request; `None` for the direct path.
    pub cpu_us: Option<f64>,
    /// The upstream's CPU µs a completed request.
    pub up_cpu_us: f64,
}

/// One closed-loop cell in one round.
pub struct ClosedCell {
    pub rps: f64,
    pub cpu_us: Option<f64>,
}

#[derive(Default)]
pub struct Results {
    pub bodies: Vec<(&'static str, usize)>,
    pub rates: Vec<u64>,
    pub paths: Vec<&'static str>,
    /// (body, rate, path) indices → one cell a round, in round order.
    pub open: HashMap<(usize, usize, usize), Vec<OpenCell>>,
    /// (body, path) → one cell a round.
    pub closed: HashMap<(usize, usize), Vec<ClosedCell>>,
    /// Each proxy's RSS after all rounds, KiB.
    pub rss: Vec<(&'static str, u64)>,
}

pub const DIRECT: &str = "direct";
pub const NGINX: &str = "nginx";

pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.retain(|x| x.is_finite());
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn ms(us: f64) -> String {
    if us.is_finite() {
        format!("{:.3}", us / 1e3)
    } else {
        "—".into()
    }
}

fn num(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "—".into()
    }
}

/// `a ÷ b` in bold, then `a` itself as `shown` writes it.
fn ratio(a: f64, b: f64, shown: String) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("**{:.2}×** ({shown})", a / b)
    } else {
        "—".into()
    }
}

impl Results {
    fn path(&self, name: &str) -> Option<usize> {
        self.paths.iter().position(|p| *p == name)
    }

    fn open_cells(&self, b: usize, r: usize, p: usize) -> &[OpenCell] {
        self.open.get(&(b, r, p)).map_or(&[], Vec::as_slice)
    }

    fn open_median(&self, b: usize, r: usize, p: usize, f: impl Fn(&OpenCell) -> f64) -> f64 {
        median(self.open_cells(b, r, p).iter().map(f).collect())
    }

    /// Median over rounds of (path − direct) in the same round.
    fn added(&self, b: usize, r: usize, p: usize, f: impl Fn(&OpenCell) -> f64) -> f64 {
        let Some(d) = self.path(DIRECT) else {
            return f64::NAN;
        };
        let (via, direct) = (self.open_cells(b, r, p), self.open_cells(b, r, d));
        median(via.iter().zip(direct).map(|(v, d)| f(v) - f(d)).collect())
    }

    fn cpu(&self, b: usize, r: usize, p: usize) -> f64 {
        self.open_median(b, r, p, |c| c.cpu_us.unwrap_or(f64::NAN))
    }

    fn closed_median(&self, b: usize, p: usize, f: impl Fn(&ClosedCell) -> f64) -> f64 {
        let cells = self.closed.get(&(b, p)).map_or(&[][..], Vec::as_slice);
        median(cells.iter().map(f).collect())
    }

    /// Per body: each proxy's CPU a request, added p50 at the top rate and
    /// closed-loop throughput as ratios to nginx's.
    pub fn headline(&self) -> String {
        let mut s = String::new();
        let Some(ng) = self.path(NGINX) else {
            s.push_str("nginx was not run, so there are no ratios to it.\n");
            return s;
        };
        let top = self.rates.len() - 1;
        for (b, (body, bytes)) in self.bodies.iter().enumerate() {
            let _ = writeln!(
                s,
                "**{body} body ({bytes} B)**, ratios to nginx (the path's own figure in brackets, nginx's in the last row):\n"
            );
            s.push_str("| path |");
            for rate in &self.rates {
                let _ = write!(s, " CPU/request at {rate}/s |");
            }
            let _ = writeln!(
                s,
                " added p50 at {}/s | closed-loop req/s |",
                self.rates[top]
            );
            s.push_str(&"|---".repeat(self.rates.len() + 3));
            s.push_str("|\n");
            for (p, name) in self.paths.iter().enumerate() {
                if *name == DIRECT || *name == NGINX {
                    continue;
                }
                let _ = write!(s, "| {name} |");
                for r in 0..self.rates.len() {
                    let cpu = self.cpu(b, r, p);
                    let cell = ratio(cpu, self.cpu(b, r, ng), format!("{} µs", num(cpu, 1)));
                    let _ = write!(s, " {cell} |");
                }
                let added = self.added(b, top, p, |c| c.p50);
                let nginx_added = self.added(b, top, ng, |c| c.p50);
                let rps = self.closed_median(b, p, |c| c.rps);
                let nginx_rps = self.closed_median(b, ng, |c| c.rps);
                let _ = writeln!(
                    s,
                    " {} | {} |",
                    ratio(added, nginx_added, format!("{} ms", ms(added))),
                    ratio(rps, nginx_rps, num(rps, 0)),
                );
            }
            s.push_str("| *nginx* |");
            for r in 0..self.rates.len() {
                let _ = write!(s, " {} µs |", num(self.cpu(b, r, ng), 1));
            }
            let _ = writeln!(
                s,
                " {} ms | {} req/s |\n",
                ms(self.added(b, top, ng, |c| c.p50)),
                num(self.closed_median(b, ng, |c| c.rps), 0)
            );
        }
        s.push_str("Targets (issue 14): CPU/request ≤ 2×, added p50 at 5,000 req/s ≤ 1.5×, closed-loop req/s ≥ 0.5×.\n");
        s
    }

    /// Every open-loop cell (medians over rounds), then the closed loop and RSS.
    pub fn full(&self) -> String {
        let mut s = String::new();
        for (b, (body, bytes)) in self.bodies.iter().enumerate() {
            let _ = writeln!(
                s,
                "**Open loop, {body} body ({bytes} B)** (ms; CPU in µs a completed request; errors summed over rounds):\n"
            );
            s.push_str("| rate | path | p50 | p99 | p99.9 | added p50 | added p99 | achieved/s | errors | proxy CPU/req | upstream CPU/req |\n");
            s.push_str(&"|---".repeat(11));
            s.push_str("|\n");
            for (r, rate) in self.rates.iter().enumerate() {
                for (p, name) in self.paths.iter().enumerate() {
                    let errors: usize = self.open_cells(b, r, p).iter().map(|c| c.errors).sum();
                    let _ = writeln!(
                        s,
                        "| {rate} | {name} | {} | {} | {} | {} | {} | {} | {errors} | {} | {} |",
                        ms(self.open_median(b, r, p, |c| c.p50)),
                        ms(self.open_median(b, r, p, |c| c.p99)),
                        ms(self.open_median(b, r, p, |c| c.p999)),
                        ms(self.added(b, r, p, |c| c.p50)),
                        ms(self.added(b, r, p, |c| c.p99)),
                        num(self.open_median(b, r, p, |c| c.achieved), 0),
                        num(self.cpu(b, r, p), 1),
                        num(self.open_median(b, r, p, |c| c.up_cpu_us), 1),
                    );
                }
            }
            s.push('\n');
        }
        s.push_str("**Closed loop** (64 connections; req/s, and the proxy's CPU µs a request at that load):\n\n| path |");
        for (body, _) in &self.bodies {
            let _ = write!(s, " {body}: req/s | {body}: CPU/req |");
        }
        s.push('\n');
        s.push_str(&"|---".repeat(1 + 2 * self.bodies.len()));
        s.push_str("|\n");
        for (p, name) in self.paths.iter().enumerate() {
            let _ = write!(s, "| {name} |");
            for b in 0..self.bodies.len() {
                let _ = write!(
                    s,
                    " {} | {} |",
                    num(self.closed_median(b, p, |c| c.rps), 0),
                    num(
                        self.closed_median(b, p, |c| c.cpu_us.unwrap_or(f64::NAN)),
                        1
                    )
                );
            }
            s.push('\n');
        }
        s.push_str("\n**RSS after all rounds**: ");
        let rss: Vec<String> = self
            .rss
            .iter()
            .map(|(n, kib)| format!("{n} {:.1} MiB", *kib as f64 / 1024.0))
            .collect();
        s.push_str(&rss.join(", "));
        s.push_str(".\n");
        s
    }
}
