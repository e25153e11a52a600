//! Tests of the pace fit and of its first reading.

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
            let secs =
                (self.latency_ms + requests as f64 * self.step_ms) / 1e3 + work as f64 / self.rate;
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

#[test]
fn the_first_answers_reading_replaces_the_guess_until_the_fit_stands() {
    let p = Pace::default();
    assert_eq!(p.tokens_per_s(), None, "no rate to drain a queue by yet");
    // A CPU engine: 45 ms steps, 300 prefill tokens a second, idle.
    assert!(p.observe(
        Ahead {
            work: 440,
            requests: 0
        },
        440.0 / 300.0
    ));
    assert!(p.observe_gap(0.045));
    assert_eq!(p.overhead_tokens(), REQUEST_OVERHEAD, "one gap: the guess");
    assert_eq!(p.tokens_per_s(), None, "one gap: no reading");
    assert!(p.observe_gap(0.050));
    let s = p.snapshot();
    assert_eq!(s.basis, Basis::FirstAnswers, "{s:?}");
    assert!(!s.learned && s.gaps == 2 && s.answers == 1, "{s:?}");
    // 46 ms × 300 a second = 14 tokens, floored at the range's 16.
    assert_eq!(s.overhead_tokens, OVERHEAD_RANGE.0);
    assert!(
        (s.tokens_per_s.unwrap_or_default() - 300.0).abs() < 1e-6,
        "{s:?}"
    );
    assert_eq!(p.tokens_per_s(), s.tokens_per_s, "what drains its queue");
    // A GPU engine: 20 ms at 10,000 a second.
    let gpu = Pace::default();
    gpu.observe(
        Ahead {
            work: 2000,
            requests: 0,
        },
        0.2,
    );
    gpu.observe_gap(0.02);
    gpu.observe_gap(0.02);
    assert_eq!(gpu.overhead_tokens(), 200);
    // A stalled gap is refused; the fit, once it stands, takes over.
    assert!(!gpu.observe_gap(60.0));
    FAST.answer(&gpu, loaded(64));
    let s = gpu.snapshot();
    assert!(
        s.basis == Basis::Fit && s.overhead_tokens.abs_diff(200) <= 4,
        "{s:?}"
    );
    assert_eq!(s.refused, 1);
    let rate = gpu.tokens_per_s().unwrap_or_default();
    assert!(
        (rate - FAST.rate).abs() < FAST.rate * 0.02,
        "the fit's: {rate}"
    );
}

#[test]
fn a_fit_that_stood_is_held_and_one_swing_moves_it_only_a_little() {
    let p = Pace::default();
    FAST.answer(&p, loaded(40));
    assert_eq!(p.overhead_tokens(), 200);
    // Twenty-five answers where a queue ahead even shortens a first token
    // (noise, batching): a young fit drops to the floor; what is charged
    // follows it slowly.
    let odd = Engine {
        latency_ms: 200.0,
        step_ms: -40.0,
        ..FAST
    };
    odd.answer(&p, loaded(25));
    let s = p.snapshot();
    let fits = s.step_ms.unwrap_or(-1.0) * s.tokens_per_s.unwrap_or(-1.0) / 1e3;
    assert!(s.fit_stands && fits < 60.0, "{s:?}");
    assert!((120..200).contains(&s.overhead_tokens), "{s:?}");
    // Back to its usual pace, the fit and what is charged meet again.
    FAST.answer(&p, loaded(300));
    let s = p.snapshot();
    let fits = s.step_ms.unwrap_or(-1.0) * s.tokens_per_s.unwrap_or(-1.0) / 1e3;
    assert!((s.overhead_tokens as f64 - fits).abs() <= 2.0, "{s:?}");
    assert!(s.overhead_tokens.abs_diff(200) <= 30, "{s:?}");
    // Answers that no fit can stand on (one sized, no queue) keep the last
    // fit, not the first answers' reading.
    p.observe_gap(0.5);
    p.observe_gap(0.5);
    FAST.answer(&p, (0..2000).map(|_| (500, 0)));
    let s = p.snapshot();
    assert!(s.learned && !s.fit_stands && s.basis == Basis::Fit, "{s:?}");
    assert!(
        s.overhead_tokens.abs_diff(200) <= 30 && s.gaps == 2,
        "{s:?}"
    );
}

#[test]
fn a_sample_is_recounted_in_the_engines_tokens_once_its_usage_is_known() {
    // Dispatched under the 4-characters-a-token guess: 1,000 tokens of work
    // (its own and what was queued ahead) for a 700-token prompt that the
    // engine counts as 400 (7 characters a token).
    let sample = Ahead {
        work: 1000,
        requests: 1,
    };
    assert_eq!(
        sample.recounted(700, 400),
        Ahead {
            work: 571,
            requests: 1
        }
    );
    assert_eq!(sample.recounted(700, 1400).work, 2000);
    // Usage that is not about this prompt, or missing, changes nothing.
    for absurd in [0, 80, 5_700, u64::MAX] {
        assert_eq!(sample.recounted(700, absurd), sample, "{absurd}");
    }
    assert_eq!(sample.recounted(0, 400), sample);
}
