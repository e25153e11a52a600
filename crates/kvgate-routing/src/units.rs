//! Tokens a character, learned from the engine's own answers instead of the
//! 4 characters a token [`crate::cost::CHARS_PER_TOKEN`] guesses: English
//! prose is near 4, code and identifiers near 2, CJK text near 1 or below,
//! and a guess that is 2× off makes every cached block look half (or twice)
//! as valuable as it is against a queue counted in real tokens.
//!
//! Each answer whose `usage.prompt_tokens` counts a prompt whose canonical
//! text the gateway saw whole gives one sample, `prompt_tokens ÷ characters`
//! (the chat template's own tokens included: they are prefilled too). The
//! estimate is the running mean of the first [`HORIZON`] samples, then an
//! exponential average over about that many, so it follows a change of
//! model or of traffic. It is used once [`MIN_ANSWERS`] samples exist; until
//! then the 4-characters guess stands. A sample is refused — counted, never
//! moving the estimate — when usage is missing or zero, the prompt shorter
//! than [`MIN_CHARS`] (template overhead would dominate), the ratio outside
//! [`SANE`], or, once learned, more than 4× away from the estimate. Lock-free:
//! one answer's sample is a few atomic operations; a read is one load.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::cost::CHARS_PER_TOKEN;

/// Samples before the learned value replaces the guess.
pub const MIN_ANSWERS: u64 = 8;
/// Samples the average reaches back over, about.
pub const HORIZON: u64 = 64;
/// Prompts shorter than this say more about the template than the text.
pub const MIN_CHARS: u64 = 64;
/// Tokens a character outside this range are not a tokenizer's.
pub const SANE: (f64, f64) = (0.02, 4.0);

/// The 4-characters guess, in tokens a character.
pub const DEFAULT: f64 = 1.0 / CHARS_PER_TOKEN as f64;

/// One model's tokens a character, as its answers show it.
#[derive(Debug)]
pub struct Density {
    /// The estimate's f64 bits.
    estimate: AtomicU64,
    answers: AtomicU64,
    refused: AtomicU64,
}

impl Default for Density {
    fn default() -> Self {
        Self {
            estimate: AtomicU64::new(DEFAULT.to_bits()),
            answers: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

/// What `explain` shows of a density.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learned {
    /// Tokens a character in use (the guess until `answers` ≥ [`MIN_ANSWERS`]).
    pub tokens_per_char: f64,
    pub answers: u64,
    pub refused: u64,
    pub learned: bool,
}

impl Density {
    /// An answer said `prompt_tokens` for a prompt of `chars` characters.
    /// Whether the sample was taken (see the module docs for refusals).
    pub fn observe(&self, chars: u64, prompt_tokens: u64) -> bool {
        let ratio = prompt_tokens as f64 / chars.max(1) as f64;
        let plausible = chars >= MIN_CHARS
            && prompt_tokens > 0
            && (SANE.0..=SANE.1).contains(&ratio)
            && match self.learned() {
                Some(est) => ratio <= est * 4.0 && ratio >= est / 4.0,
                None => true,
            };
        if !plausible {
            self.refused.fetch_add(1, Relaxed);
            return false;
        }
        let n = self.answers.fetch_add(1, Relaxed) + 1;
        let alpha = 1.0 / n.min(HORIZON) as f64;
        let _ = self.estimate.fetch_update(Relaxed, Relaxed, |bits| {
            let old = if n == 1 { ratio } else { f64::from_bits(bits) };
            Some((old + alpha * (ratio - old)).to_bits())
        });
        true
    }

    /// The learned tokens a character, once [`MIN_ANSWERS`] samples exist.
    pub fn learned(&self) -> Option<f64> {
        (self.answers.load(Relaxed) >= MIN_ANSWERS)
            .then(|| f64::from_bits(self.estimate.load(Relaxed)))
    }

    /// Tokens a character in use: learned, or the guess.
    pub fn tokens_per_char(&self) -> f64 {
        self.learned().unwrap_or(DEFAULT)
    }

    /// Estimated tokens of `chars` characters of prompt.
    pub fn tokens_of(&self, chars: usize) -> u64 {
        (chars as f64 * self.tokens_per_char()).ceil() as u64
    }

    /// Tokens an index block of `block_chars` characters stands for (≥ 1).
    pub fn block_tokens(&self, block_chars: usize) -> u64 {
        ((block_chars as f64 * self.tokens_per_char()).round() as u64).max(1)
    }

    pub fn snapshot(&self) -> Learned {
        let answers = self.answers.load(Relaxed);
        Learned {
            tokens_per_char: self.tokens_per_char(),
            answers,
            refused: self.refused.load(Relaxed),
            learned: answers >= MIN_ANSWERS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guess_stands_until_enough_answers_then_the_engines_ratio() {
        let d = Density::default();
        assert_eq!(
            d.tokens_of(4000),
            1000,
            "4 characters a token to begin with"
        );
        assert_eq!(d.block_tokens(256), 64);
        for _ in 0..MIN_ANSWERS - 1 {
            assert!(d.observe(2000, 1000));
        }
        assert_eq!(d.learned(), None);
        assert_eq!(d.tokens_of(4000), 1000);
        assert!(d.observe(2000, 1000));
        assert_eq!(d.learned(), Some(0.5));
        assert_eq!(d.tokens_of(4000), 2000, "2 characters a token, as answered");
        assert_eq!(d.block_tokens(256), 128);
        let s = d.snapshot();
        assert!(
            s.learned && s.answers == MIN_ANSWERS && s.refused == 0,
            "{s:?}"
        );
    }

    #[test]
    fn missing_zero_short_or_absurd_usage_never_moves_it() {
        let d = Density::default();
        for _ in 0..MIN_ANSWERS {
            d.observe(1000, 250);
        }
        let before = d.learned();
        assert!(!d.observe(1000, 0), "zero (or missing) usage");
        assert!(!d.observe(10, 8), "a prompt too short to say");
        assert!(!d.observe(1000, 100_000), "100 tokens a character");
        assert!(!d.observe(100_000, 1), "far below any tokenizer");
        assert!(!d.observe(1000, 1500), "6x the estimate once learned");
        assert_eq!(d.learned(), before);
        assert_eq!(d.snapshot().refused, 5);
        // Before anything is learned, garbage cannot seed it either.
        let fresh = Density::default();
        assert!(!fresh.observe(0, 0));
        assert!(!fresh.observe(1000, 9000));
        assert_eq!(fresh.snapshot().answers, 0);
        assert_eq!(fresh.tokens_per_char(), DEFAULT);
    }

    #[test]
    fn it_follows_a_new_model_within_its_horizon() {
        let d = Density::default();
        for _ in 0..200 {
            d.observe(1000, 250);
        }
        // Code at about 2 characters a token: within the 4x band, so taken.
        for _ in 0..HORIZON * 3 {
            d.observe(1000, 500);
        }
        let est = d.tokens_per_char();
        assert!((est - 0.5).abs() < 0.02, "{est}");
    }
}
