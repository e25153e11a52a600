//! An instance's prefill rate, as its first bytes show it, so that a request
//! whose answer will not say when its prefill ended can give its queued
//! charge back on time.
//!
//! A streamed answer's first byte is its first token: the engine has
//! prefilled the prompt, and the request stops counting as queued prefill
//! ([`super::InflightGuard::first_byte`]). A non-streaming answer's first byte
//! is its last: until then its charge would count as queued through its whole
//! decode, and a holder serving such requests would look busy long after its
//! prefill queue had drained — enough to send the next request for its prefix
//! elsewhere, to be prefilled again. So such a request's charge is given back
//! once the queue ahead of it and its own prefill have drained at the rate
//! the instance has shown.
//!
//! The rate is a decaying maximum of `uncached tokens ÷ time to first byte`
//! over the instance's answers. Each observation includes queueing, network
//! and (for non-streaming answers) decoding, so each is at most the engine's
//! true rate: the estimate errs low, and a charge is never given back before
//! its prefill can have ended. Only prompts of at least [`MIN_TOKENS`]
//! uncached tokens count, where the prefill is most of the time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Uncached tokens below which an answer says more about step overhead than rate.
pub const MIN_TOKENS: u64 = 1024;

#[derive(Debug, Default)]
pub struct PrefillRate {
    /// Tokens per second; 0 until an answer has shown one.
    tokens_per_s: AtomicU64,
}

impl PrefillRate {
    /// `uncached` tokens took `elapsed` from dispatch to the first byte.
    pub fn observe(&self, uncached: u64, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        if uncached < MIN_TOKENS || secs <= 0.0 {
            return;
        }
        let seen = (uncached as f64 / secs) as u64;
        // Each answer lets the old maximum fade by 1/64, so a slower engine
        // (a heavier model after a restart) is learned again.
        let _ = self
            .tokens_per_s
            .fetch_update(Relaxed, Relaxed, |old| Some(seen.max(old - old / 64)));
    }

    /// The rate shown, if one has been.
    pub fn tokens_per_s(&self) -> Option<f64> {
        Some(self.tokens_per_s.load(Relaxed))
            .filter(|&r| r > 0)
            .map(|r| r as f64)
    }

    /// How long `tokens` of prefill take at the rate shown, if one has been.
    pub fn drain_time(&self, tokens: u64) -> Option<Duration> {
        let rate = self.tokens_per_s.load(Relaxed);
        (rate > 0).then(|| Duration::from_secs_f64(tokens as f64 / rate as f64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_the_fastest_answer_seen_fading_slowly() {
        let r = PrefillRate::default();
        assert_eq!(r.drain_time(1000), None);
        r.observe(500, Duration::from_millis(1)); // too small to say
        assert_eq!(r.drain_time(1000), None);
        r.observe(8000, Duration::from_secs(2)); // 4,000 tokens/s
        r.observe(8000, Duration::from_secs(4)); // slower: decoding or queueing
        let t = r.drain_time(4000).unwrap_or_default().as_secs_f64();
        assert!((1.0..1.05).contains(&t), "{t}");
    }
}
