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
//! [`MAX_OVERHEAD_ERROR`] tokens or that fraction of it (times to first token are noisy: a fit of
//! a few noisy answers must not steer routing); whenever it stops meeting
//! that, the guess stands. The learned overhead is clamped to [`OVERHEAD_RANGE`]. A
//! sample is refused (counted, never moving the fit) when its time is not
//! positive or above [`MAX_SECS`], or its work absurd; once learned, a
//! sample's time is clipped to within [`CLIP`]× of the fit's prediction, so
//! one stalled answer cannot swing it, while a lasting change of engine still
//! moves it within the horizon.
//!
//! Cost: one uncontended lock an answer; a routing decision reads one atomic.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::cost::{REQUEST_OVERHEAD, running_weight};

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

/// What a first token waited for, as the gateway saw it at dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ahead {
    /// Prefill tokens: its own uncached and those of the requests queued ahead.
    pub work: u64,
    /// Requests queued ahead of it (no first token yet).
    pub requests: u64,
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

    /// The step in prefill tokens, clamped.
    fn overhead(&self) -> u64 {
        ((self.step_s * self.rate).round() as u64).clamp(OVERHEAD_RANGE.0, OVERHEAD_RANGE.1)
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

/// One instance's pace, as its streamed answers show it.
#[derive(Debug)]
pub struct Pace {
    sums: Mutex<Sums>,
    /// The overhead in use, in prefill tokens (the guess until learned).
    overhead: AtomicU64,
    refused: AtomicU64,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            sums: Mutex::new(Sums::default()),
            overhead: AtomicU64::new(REQUEST_OVERHEAD),
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
    /// Prefill tokens a second, once learned.
    pub tokens_per_s: Option<f64>,
    /// What each request queued ahead adds to a first token, once learned.
    pub step_ms: Option<f64>,
    /// The part of a first token's time no queue explains (HTTP, its own step).
    pub latency_ms: Option<f64>,
    pub answers: u64,
    pub refused: u64,
    pub learned: bool,
}

impl Pace {
    /// A streamed answer's first token came `secs` after dispatch, with
    /// `ahead` before it. Whether the sample was taken.
    pub fn observe(&self, ahead: Ahead, secs: f64) -> bool {
        if !(secs.is_finite() && secs > 0.0 && secs <= MAX_SECS) || ahead.work > MAX_WORK {
            self.refused.fetch_add(1, Relaxed);
            return false;
        }
        let Ok(mut sums) = self.sums.lock() else {
            return false;
        };
        let (x, q) = (ahead.work as f64, ahead.requests as f64);
        let y = match sums.fit() {
            Some(f) => {
                let predicted = f.predict(x, q).max(1e-6);
                secs.clamp(predicted / CLIP, predicted * CLIP)
            }
            None => secs,
        };
        sums.add(x, q, y);
        let overhead = sums.fit().map_or(REQUEST_OVERHEAD, |f| f.overhead());
        self.overhead.store(overhead, Relaxed);
        true
    }

    /// Prefill tokens one request costs its instance's queue: learned, or
    /// [`REQUEST_OVERHEAD`].
    pub fn overhead_tokens(&self) -> u64 {
        self.overhead.load(Relaxed)
    }

    pub fn snapshot(&self) -> Learned {
        let sums = self.sums.lock().map(|s| *s).unwrap_or_default();
        let fit = sums.fit();
        let overhead = self.overhead_tokens();
        Learned {
            overhead_tokens: overhead,
            running_weight: running_weight(overhead),
            tokens_per_s: fit.map(|f| f.rate),
            step_ms: fit.map(|f| f.step_s * 1e3),
            latency_ms: fit.map(|f| f.latency_s * 1e3),
            answers: sums.n,
            refused: self.refused.load(Relaxed),
            learned: fit.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine: `latency_ms` + work at `rate` tokens a second + `step_ms`
    /// for each request ahead.
    struct Engine {
        latency_ms: f64,
        rate: f64,
        step_ms: f64,
    }

    impl Engine {
        fn answer(&self, p: &Pace, samples: impl IntoIterator<Item = (u64, u64)>) {
            for (work, requests) in samples {
                let secs = (self.latency_ms + requests as f64 * self.step_ms) / 1e3
                    + work as f64 / self.rate;
                assert!(p.observe(Ahead { work, requests }, secs));
            }
        }
    }

    /// Varied work and queues, the way a loaded instance shows them.
    fn loaded(n: u64) -> impl Iterator<Item = (u64, u64)> {
        (0..n).map(|i| ((i * 7919) % 16 * 500 + 100, (i * 31) % 5))
    }

    const FAST: Engine = Engine {
        latency_ms: 5.0,
        rate: 10_000.0,
        step_ms: 20.0,
    };

    #[test]
    fn the_guess_stands_until_the_plane_is_known_then_the_engines_own() {
        let p = Pace::default();
        assert_eq!(p.overhead_tokens(), REQUEST_OVERHEAD);
        FAST.answer(&p, loaded(MIN_ANSWERS - 1));
        assert_eq!(p.overhead_tokens(), REQUEST_OVERHEAD, "too few answers");
        FAST.answer(&p, loaded(MIN_ANSWERS).skip(MIN_ANSWERS as usize - 1));
        let s = p.snapshot();
        assert!(s.learned, "{s:?}");
        // 20 ms a queued request at 10,000 tokens a second.
        assert_eq!(s.overhead_tokens, 200);
        assert_eq!(s.running_weight, 25);
        let near = |v: Option<f64>, want: f64| (v.unwrap_or(-1.0) - want).abs() < want * 0.01;
        assert!(near(s.tokens_per_s, 10_000.0), "{s:?}");
        assert!(near(s.step_ms, 20.0) && near(s.latency_ms, 5.0), "{s:?}");
    }

    #[test]
    fn an_idle_engine_or_one_sized_prompts_keep_the_guess() {
        let idle = Pace::default();
        FAST.answer(&idle, (0..100).map(|i| (i % 16 * 500 + 100, 0)));
        let s = idle.snapshot();
        assert!(!s.learned && s.answers == 100, "{s:?}");
        assert_eq!(s.overhead_tokens, REQUEST_OVERHEAD);
        let same = Pace::default();
        FAST.answer(&same, (0..100).map(|i| (500, i % 4)));
        assert!(!same.snapshot().learned);
        // A queue that grows with the work, in lockstep: no telling them apart.
        let shadow = Pace::default();
        FAST.answer(&shadow, (0..100).map(|i| (i % 8 * 500, i % 8)));
        assert!(!shadow.snapshot().learned);
    }

    #[test]
    fn noisy_answers_are_trusted_only_once_they_pin_the_overhead_down() {
        let p = Pace::default();
        // ±150 ms of jitter on every answer (a shared, busy host).
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut jitter = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 301) as f64 / 1e3 - 0.15
        };
        let mut answer = |n: u64| {
            for (work, requests) in loaded(n) {
                let secs = 0.155 + requests as f64 * 0.02 + work as f64 / 10_000.0 + jitter();
                p.observe(Ahead { work, requests }, secs);
            }
        };
        answer(20);
        assert!(!p.snapshot().learned, "{:?}", p.snapshot());
        assert_eq!(p.overhead_tokens(), REQUEST_OVERHEAD);
        answer(400);
        let s = p.snapshot();
        assert!(s.learned, "{s:?}");
        assert!(s.overhead_tokens.abs_diff(200) <= 64, "{s:?}");
    }

    #[test]
    fn bad_times_never_move_it_and_a_stall_is_clipped() {
        let p = Pace::default();
        let ahead = Ahead {
            work: 1000,
            requests: 1,
        };
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_SECS + 1.0] {
            assert!(!p.observe(ahead, bad), "{bad}");
        }
        let absurd = Ahead {
            work: MAX_WORK + 1,
            requests: 0,
        };
        assert!(!p.observe(absurd, 1.0));
        assert_eq!((p.snapshot().refused, p.snapshot().answers), (6, 0));
        FAST.answer(&p, loaded(64));
        let before = p.overhead_tokens();
        assert_eq!(before, 200);
        // One answer stalled for a minute: clipped to 2x its prediction.
        assert!(p.observe(ahead, 60.0));
        let after = p.overhead_tokens();
        assert!(after.abs_diff(before) < 40, "{before} → {after}");
    }

    #[test]
    fn it_follows_a_slower_engine_and_stays_in_range() {
        let p = Pace::default();
        FAST.answer(&p, loaded(300));
        assert_eq!(p.overhead_tokens(), 200);
        // A heavier model after a restart: 100 ms steps at 4,000 tokens/s.
        let heavy = Engine {
            latency_ms: 5.0,
            rate: 4000.0,
            step_ms: 100.0,
        };
        heavy.answer(&p, loaded(1500));
        assert!(p.overhead_tokens().abs_diff(400) <= 2, "{:?}", p.snapshot());
        // A step that dwarfs the prefill is capped; no step at all, floored.
        let slow = Pace::default();
        let huge = Engine {
            step_ms: 5000.0,
            rate: 100_000.0,
            ..FAST
        };
        huge.answer(&slow, loaded(64));
        assert_eq!(slow.overhead_tokens(), OVERHEAD_RANGE.1);
        let lean = Pace::default();
        let none = Engine {
            step_ms: 0.0,
            ..FAST
        };
        none.answer(&lean, loaded(64));
        assert_eq!(lean.overhead_tokens(), OVERHEAD_RANGE.0);
    }
}
