//! An instance's pace — its prefill rate and what one queued request costs
//! the requests behind it — learned from its own times to first token, in
//! place of the [`crate::cost::REQUEST_OVERHEAD`] guess of 256 tokens.
//!
//! Time to first token on an engine that batches prefill (vLLM's chunked
//! prefill) is close to a plane in two figures the gateway knows at dispatch:
//! the prefill tokens to compute before answering (this request's uncached
//! tokens and those of the requests queued ahead of it) and how many requests
//! are queued ahead, each costing at least a step of its own:
//!
//! ```text
//! ttft ≈ latency + work / rate + ahead × step
//! ```
//!
//! A weighted least-squares fit of the streamed answers' samples gives all
//! three. The cost model counts in prefill tokens, so a queued request's step
//! enters it as `step × rate` tokens — the overhead every queued request is
//! charged — and an eighth of that for each request decoding there
//! ([`running_weight`], the guessed 256 : 32 kept: this fit does not tell a
//! decoding request's share of a step apart). `latency` (HTTP hops, the
//! request's own step) delays no one else, which is why it is fitted apart
//! and not charged. Answers that are not streamed are never samples: their
//! first byte is their last.
//!
//! The fit is used once [`MIN_ANSWERS`] samples exist, their work spreads by
//! at least [`MIN_SPREAD`] tokens, their queues ahead vary and the two are
//! not one another's shadow (an idle engine shows no queue and keeps the
//! guess), it has a positive rate, and its standard errors say the rate is
//! known within [`MAX_RATE_ERROR`] and the overhead within
//! [`MAX_OVERHEAD_ERROR`] tokens or that fraction of it (times to first token
//! are noisy: a fit of a few noisy answers must not steer routing). Until
//! then the first answers' reading stands — the gap between an answer's
//! tokens (a step) times the prefill rate an unqueued first token shows
//! ([`pace_prior`], after two answers) — and before any answer, the guess.
//!
//! Once a fit has stood, it is held: a later stretch where the fit fails its
//! checks keeps the last one that passed rather than going back to the first
//! reading, and the overhead in use follows the fit by at most a factor of
//! [`FOLLOW`] an answer. A fit over a few hundred noisy answers still swings
//! (seen in the simulator: from ~210 tokens to the floor and back within
//! 30 answers), and an instance charged a fraction of its overhead looks
//! cheaper than it is for as long; a lasting change of engine still moves
//! it within the horizon (halving takes 45 answers). (It did not, by itself,
//! even out the simulator's shares: `bench/results/shares-one-gateway.md`.) The learned
//! overhead is clamped to [`OVERHEAD_RANGE`]. A
//! sample is refused (counted, never moving the fit) when its time is not
//! positive or above [`MAX_SECS`], or its work absurd; while a fit stands, a
//! sample's time is clipped to within [`CLIP`]× of the fit's prediction, so
//! one stalled answer cannot swing it, while a lasting change of engine still
//! moves it within the horizon.
//!
//! Cost: one uncontended lock an answer; a routing decision reads one atomic.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::cost::{REQUEST_OVERHEAD, running_weight};

#[path = "pace_prior.rs"]
mod pace_prior;
use pace_prior::Prior;
pub use pace_prior::{MIN_GAPS, MIN_RATE_WORK};

/// Samples before the fit replaces the guess.
pub const MIN_ANSWERS: u64 = 16;
/// Standard deviation of the samples' work, in tokens, below which the fit
/// cannot separate the rate from the rest.
pub const MIN_SPREAD: f64 = 64.0;
/// Standard deviation of the queues ahead, in requests, below which a step
/// cannot be seen.
pub const MIN_QUEUE_SPREAD: f64 = 0.25;
/// The fit stands once its rate is known within this fraction (one
/// standard error)…
pub const MAX_RATE_ERROR: f64 = 0.25;
/// …and its overhead within this many prefill tokens, or that fraction of it.
pub const MAX_OVERHEAD_ERROR: f64 = 64.0;
/// Samples the fit reaches back over, about (exponential decay).
pub const HORIZON: f64 = 256.0;
/// Learned overheads are kept within this, in prefill tokens.
pub const OVERHEAD_RANGE: (u64, u64) = (16, 8192);
/// A first token later than this says nothing about pace.
pub const MAX_SECS: f64 = 300.0;
/// Work (prefill tokens) beyond which a sample is not an engine's.
pub const MAX_WORK: u64 = 50_000_000;
/// A learned fit clips a sample's time to within this factor of its prediction.
pub const CLIP: f64 = 2.0;
/// Once a fit has stood, the overhead in use moves toward each new fit's by
/// at most this factor an answer.
pub const FOLLOW: f64 = 1.0 + 1.0 / 64.0;

/// What a first token waited for, as the gateway saw it at dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ahead {
    /// Prefill tokens: its own uncached and those of the requests queued ahead.
    pub work: u64,
    /// Requests queued ahead of it (no first token yet).
    pub requests: u64,
}

/// How far an answer's prompt tokens may stand from the gateway's estimate
/// and still recount a sample: beyond it, the usage is not about this prompt.
pub const MAX_RECOUNT: f64 = 8.0;

impl Ahead {
    /// This sample counted in the engine's units, once its answer's usage is
    /// known: the work (this request's uncached tokens and those queued
    /// ahead, as the gateway estimated them at dispatch) rescaled by the
    /// engine's count of the prompt over the gateway's estimate of it,
    /// `estimated`. The rest of the estimate — what the gateway believed
    /// cached — stays the gateway's: the rate is used to drain, and the
    /// overhead to add to, queues counted the same way, so it must be read in
    /// those terms. (Taking the engine's `cached_tokens` for the request's
    /// own work instead lost 9 of 72 `longest_prefix` cells on the Mooncake
    /// traces, against 6 rescaled and 5 before either, in three alternated
    /// runs: `bench/results/matrix.md`.)
    ///
    /// Without it, a sample taken while the tokens a character were still
    /// the guess counts a prompt in the guess's tokens for good: on real
    /// vLLM (0.14 tokens a character, not 0.25), the first answers' prefill
    /// rate read 1.6–2.0× the engine's (`bench/results/vllm-2026-12-07-epyc.md`).
    /// A usage that is zero or further than [`MAX_RECOUNT`]× from the
    /// estimate leaves the sample as it was.
    pub fn recounted(self, estimated: u64, prompt_tokens: u64) -> Self {
        let scale = prompt_tokens as f64 / estimated.max(1) as f64;
        if prompt_tokens == 0
            || estimated == 0
            || !(1.0 / MAX_RECOUNT..=MAX_RECOUNT).contains(&scale)
        {
            return self;
        }
        Self {
            work: (self.work as f64 * scale).round() as u64,
            requests: self.requests,
        }
    }
}

/// Decayed sums of a weighted least-squares fit of `ttft` on (work, ahead).
#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    w: f64,
    x: f64,
    q: f64,
    y: f64,
    xx: f64,
    qq: f64,
    xq: f64,
    xy: f64,
    qy: f64,
    yy: f64,
    n: u64,
}

/// `secs = latency + work / rate + ahead × step`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fit {
    latency_s: f64,
    rate: f64,
    step_s: f64,
}

impl Fit {
    fn predict(&self, x: f64, q: f64) -> f64 {
        self.latency_s + x / self.rate + q * self.step_s
    }
}

impl Sums {
    fn add(&mut self, x: f64, q: f64, y: f64) {
        let k = 1.0 - 1.0 / HORIZON;
        self.w = self.w * k + 1.0;
        self.x = self.x * k + x;
        self.q = self.q * k + q;
        self.y = self.y * k + y;
        self.xx = self.xx * k + x * x;
        self.qq = self.qq * k + q * q;
        self.xq = self.xq * k + x * q;
        self.xy = self.xy * k + x * y;
        self.qy = self.qy * k + q * y;
        self.yy = self.yy * k + y * y;
        self.n += 1;
    }

    /// The fit, when the samples can support one.
    fn fit(&self) -> Option<Fit> {
        if self.n < MIN_ANSWERS || self.w <= 0.0 {
            return None;
        }
        let w = self.w;
        let (mx, mq, my) = (self.x / w, self.q / w, self.y / w);
        let cxx = self.xx / w - mx * mx;
        let cqq = self.qq / w - mq * mq;
        let cxq = self.xq / w - mx * mq;
        let cxy = self.xy / w - mx * my;
        let cqy = self.qy / w - mq * my;
        let det = cxx * cqq - cxq * cxq;
        let spread = cxx >= MIN_SPREAD * MIN_SPREAD && cqq >= MIN_QUEUE_SPREAD * MIN_QUEUE_SPREAD;
        // Work and queue nearly one line: neither coefficient can be trusted.
        if !(spread && det.is_finite() && det > 0.05 * cxx * cqq) {
            return None;
        }
        let slope = (cqq * cxy - cxq * cqy) / det;
        let step = (cxx * cqy - cxq * cxy) / det;
        if !(slope.is_finite() && slope > 0.0 && step.is_finite()) {
            return None;
        }
        // Standard errors from the residuals (about w samples, 3 fitted):
        // the fit stands only where it is known well enough to act on.
        let cyy = self.yy / w - my * my;
        let residual = ((cyy - slope * cxy - step * cqy) * w / (w - 3.0).max(1.0)).max(0.0);
        let se_slope = (residual * cqq / (det * w)).sqrt();
        let se_step = (residual * cxx / (det * w)).sqrt();
        let overhead = step / slope;
        let tolerance = MAX_OVERHEAD_ERROR.max(overhead * MAX_RATE_ERROR);
        if !(se_slope <= slope * MAX_RATE_ERROR && se_step / slope <= tolerance) {
            return None;
        }
        Some(Fit {
            latency_s: (my - slope * mx - step * mq).max(0.0),
            rate: 1.0 / slope,
            step_s: step.max(0.0),
        })
    }
}

/// What the answers have shown: the fit's sums, the first reading, and what
/// the fits that stood have settled on.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    sums: Sums,
    prior: Prior,
    held: Option<Held>,
}

/// The last fit that stood, and the overhead in use following the fits.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Held {
    fit: Fit,
    /// Prefill tokens, within [`OVERHEAD_RANGE`].
    overhead: f64,
}

impl Seen {
    /// Takes a sample's fit, where it stands, into what is held.
    fn follow(&mut self) {
        let Some(fit) = self.sums.fit() else {
            return;
        };
        let (lo, hi) = (OVERHEAD_RANGE.0 as f64, OVERHEAD_RANGE.1 as f64);
        let target = (fit.step_s * fit.rate).clamp(lo, hi);
        let overhead = match self.held {
            None => target,
            Some(h) => target.clamp(h.overhead / FOLLOW, h.overhead * FOLLOW),
        };
        self.held = Some(Held { fit, overhead });
    }

    /// The prefill rate: the held fit's, else the first reading's.
    fn rate(&self) -> Option<f64> {
        self.held
            .map(|h| h.fit.rate)
            .or(self.prior.reading().map(|r| r.1))
    }

    /// The overhead to charge: the held fit's, else the first reading's, else the guess.
    fn overhead(&self) -> (u64, Basis) {
        if let Some(h) = self.held {
            return (clamp_overhead(h.overhead), Basis::Fit);
        }
        match self.prior.reading() {
            Some((step_s, rate)) => (clamp_overhead(step_s * rate), Basis::FirstAnswers),
            None => (REQUEST_OVERHEAD, Basis::Guess),
        }
    }
}

fn clamp_overhead(tokens: f64) -> u64 {
    (tokens.round() as u64).clamp(OVERHEAD_RANGE.0, OVERHEAD_RANGE.1)
}

/// What the overhead in use rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// [`REQUEST_OVERHEAD`]: nothing seen yet.
    Guess,
    /// The first answers' step × prefill rate ([`pace_prior`]).
    FirstAnswers,
    /// The fit of first tokens on work and queue.
    Fit,
}

/// One instance's pace, as its streamed answers show it.
/// What routing reads (`overhead`, `rate`) comes first (`repr(C)`), so that
/// a view of many instances finds it beside their other load figures.
#[derive(Debug)]
#[repr(C)]
pub struct Pace {
    /// The overhead in use, in prefill tokens (the guess until learned).
    overhead: AtomicU64,
    /// The prefill rate in use, tokens a second as `f64` bits (0: none yet).
    rate: AtomicU64,
    refused: AtomicU64,
    seen: Mutex<Seen>,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            seen: Mutex::new(Seen::default()),
            overhead: AtomicU64::new(REQUEST_OVERHEAD),
            rate: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

/// What `explain` shows of a pace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learned {
    /// Prefill tokens one request costs a queue, whatever its size.
    pub overhead_tokens: u64,
    /// Prefill tokens charged for each request decoding on the instance.
    pub running_weight: u64,
    /// Prefill tokens a second: the fit's, or the first answers'.
    pub tokens_per_s: Option<f64>,
    /// What each request queued ahead adds to a first token: the fit's, or
    /// the first answers' gap between tokens.
    pub step_ms: Option<f64>,
    /// The part of a first token's time no queue explains (HTTP, its own step).
    pub latency_ms: Option<f64>,
    pub answers: u64,
    /// Answers whose gaps between tokens were seen (the first reading's step).
    pub gaps: u64,
    pub refused: u64,
    /// A fit has stood: the overhead and rate are learned (held since).
    pub learned: bool,
    /// The fit over the latest answers stands (else the last one is held).
    pub fit_stands: bool,
    pub basis: Basis,
}

impl Pace {
    /// A streamed answer's first token came `secs` after dispatch, with
    /// `ahead` before it. Whether the sample was taken.
    pub fn observe(&self, ahead: Ahead, secs: f64) -> bool {
        if !(secs.is_finite() && secs > 0.0 && secs <= MAX_SECS) || ahead.work > MAX_WORK {
            self.refused.fetch_add(1, Relaxed);
            return false;
        }
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        let (x, q) = (ahead.work as f64, ahead.requests as f64);
        let y = match seen.sums.fit() {
            Some(f) => {
                let predicted = f.predict(x, q).max(1e-6);
                secs.clamp(predicted / CLIP, predicted * CLIP)
            }
            None => secs,
        };
        seen.sums.add(x, q, y);
        seen.follow();
        seen.prior.first_token(ahead.work, ahead.requests, secs);
        self.publish(&seen);
        true
    }

    /// A streamed answer decoded with `secs` between its tokens (the mean of
    /// its first few gaps). Whether the sample was taken.
    pub fn observe_gap(&self, secs: f64) -> bool {
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        if !seen.prior.gap(secs) {
            drop(seen);
            self.refused.fetch_add(1, Relaxed);
            return false;
        }
        self.publish(&seen);
        true
    }

    /// What routing reads without the lock: the overhead and the rate.
    fn publish(&self, seen: &Seen) {
        self.overhead.store(seen.overhead().0, Relaxed);
        self.rate
            .store(seen.rate().unwrap_or(0.0).to_bits(), Relaxed);
    }

    /// Prefill tokens one request costs its instance's queue: learned, or
    /// [`REQUEST_OVERHEAD`].
    pub fn overhead_tokens(&self) -> u64 {
        self.overhead.load(Relaxed)
    }

    /// Prefill tokens a second: the fit's, or the first answers' reading;
    /// `None` before either (what drains a queued charge, [`crate::drain`]).
    pub fn tokens_per_s(&self) -> Option<f64> {
        Some(f64::from_bits(self.rate.load(Relaxed))).filter(|r| r.is_finite() && *r > 0.0)
    }

    pub fn snapshot(&self) -> Learned {
        let seen = self.seen.lock().map(|s| *s).unwrap_or_default();
        let fit = seen.held.map(|h| h.fit);
        let (overhead, basis) = seen.overhead();
        let reading = seen.prior.reading();
        Learned {
            overhead_tokens: overhead,
            running_weight: running_weight(overhead),
            tokens_per_s: fit.map(|f| f.rate).or(reading.map(|r| r.1)),
            step_ms: fit.map(|f| f.step_s * 1e3).or(reading.map(|r| r.0 * 1e3)),
            latency_ms: fit.map(|f| f.latency_s * 1e3),
            fit_stands: seen.sums.fit().is_some(),
            answers: seen.sums.n,
            gaps: seen.prior.gaps(),
            refused: self.refused.load(Relaxed),
            learned: seen.held.is_some(),
            basis,
        }
    }
}

#[cfg(test)]
#[path = "pace_tests.rs"]
mod tests;
