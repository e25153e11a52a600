//! A first reading of an instance's pace, from its first streamed answers,
//! used until the fit of [`super`] is known (which takes at least
//! [`super::MIN_ANSWERS`] answers with varied queues — more than a fleet
//! fresh from a deploy, a restart or a scale-out has given it).
//!
//! Two figures a single answer shows:
//!
//! - the **step**: the gap between an answer's tokens once it decodes. Every
//!   engine step produces one token for each decoding sequence, so the gap
//!   is a step — lengthened when other requests' prefill shares it, never
//!   shortened. Kept as a minimum, allowed to rise by a thirty-second an
//!   answer so that a slower engine (a heavier model after a restart) is
//!   followed within a few dozen answers;
//! - the **prefill rate**: an answer that met no queue ahead took about its
//!   own uncached tokens ÷ rate to its first token. Only prompts of at least
//!   [`MIN_RATE_WORK`] tokens count (below it the step and the network are
//!   most of the time); an average of them, the latest weighing a quarter.
//!
//! Their product is what one queued request costs the others, in prefill
//! tokens: the overhead the cost model charges. On real vLLM on a CPU
//! (SmolLM2-135M) it is 13–15 tokens — 45 ms steps at 300 tokens a second —
//! against the 256-token guess; on a 70B model on H100s, 25 ms × 12,000 = 300.
//! It needs [`MIN_GAPS`] answers' gaps and one rate, so it stands after two
//! streamed answers an instance. The rate reads low where an answer's own
//! step and the HTTP hop are much of its time to first token (short prompts
//! on a fast engine): the charge then errs low, toward the holder, until the
//! fit stands.

/// Answers whose token gaps are seen before the prior stands.
pub const MIN_GAPS: u64 = 2;
/// Uncached tokens below which a first token says little about the rate.
pub const MIN_RATE_WORK: u64 = 256;
/// A gap between tokens longer than this is a stall, not a step.
pub const MAX_GAP_SECS: f64 = 10.0;
/// How far the step may rise in one answer (a fraction of it).
const RISE: f64 = 1.0 / 32.0;
/// The weight of the latest rate in the average.
const RATE_WEIGHT: f64 = 0.25;

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Prior {
    step_s: f64,
    gaps: u64,
    tokens_per_s: f64,
    rates: u64,
}

impl Prior {
    /// An answer decoded with `secs` between tokens. Whether it was taken.
    pub fn gap(&mut self, secs: f64) -> bool {
        if !(secs.is_finite() && secs > 0.0 && secs <= MAX_GAP_SECS) {
            return false;
        }
        self.step_s = if self.gaps == 0 {
            secs
        } else {
            secs.min(self.step_s * (1.0 + RISE))
        };
        self.gaps += 1;
        true
    }

    /// A first token `secs` after dispatch, `work` uncached tokens and
    /// `requests` queued ahead of it (times already checked by the caller).
    pub fn first_token(&mut self, work: u64, requests: u64, secs: f64) {
        if requests > 0 || work < MIN_RATE_WORK {
            return;
        }
        let rate = work as f64 / secs;
        self.tokens_per_s = if self.rates == 0 {
            rate
        } else {
            self.tokens_per_s + RATE_WEIGHT * (rate - self.tokens_per_s)
        };
        self.rates += 1;
    }

    /// The step and the rate, once both are seen.
    pub fn reading(&self) -> Option<(f64, f64)> {
        (self.gaps >= MIN_GAPS && self.rates > 0).then_some((self.step_s, self.tokens_per_s))
    }

    /// Answers whose gaps were seen.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_stands_after_two_gaps_and_one_rate() {
        let mut p = Prior::default();
        assert!(p.gap(0.045));
        p.first_token(440, 0, 1.5);
        assert_eq!(p.reading(), None, "one gap");
        assert!(p.gap(0.047));
        let (step, rate) = p.reading().unwrap_or_default();
        // The shorter gap, let rise by a thirty-second toward the longer.
        assert!((step - 0.045 * (1.0 + RISE)).abs() < 1e-9, "{step}");
        assert!((rate - 440.0 / 1.5).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn queued_or_small_answers_teach_no_rate_and_stalls_no_step() {
        let mut p = Prior::default();
        p.first_token(4000, 1, 1.0);
        p.first_token(MIN_RATE_WORK - 1, 0, 0.01);
        for bad in [0.0, -1.0, f64::NAN, MAX_GAP_SECS * 2.0] {
            assert!(!p.gap(bad), "{bad}");
        }
        assert!(p.gap(0.02) && p.gap(0.02));
        assert_eq!(p.reading(), None);
    }

    #[test]
    fn a_shared_step_is_seen_through_and_a_slower_engine_followed() {
        let mut p = Prior::default();
        p.first_token(1000, 0, 0.1);
        for _ in 0..4 {
            p.gap(0.02);
        }
        // Steps lengthened by other requests' prefill: the minimum stays.
        p.gap(0.2);
        let (step, _) = p.reading().unwrap_or_default();
        assert!((step - 0.02 * (1.0 + RISE)).abs() < 1e-9, "{step}");
        // Twice as slow for good: followed, a thirty-second an answer.
        for _ in 0..30 {
            p.gap(0.04);
        }
        assert!((p.reading().unwrap_or_default().0 - 0.04).abs() < 1e-9);
    }
}
