//! How much of an instance's queued prefill its engine has computed already:
//! the queue drains at the instance's learned prefill rate while it is not
//! empty, so a prompt half prefilled is charged half, not whole, until its
//! first token gives its charge back.
//!
//! Without it a holder is charged its whole queue until each request's first
//! token, however far along the engine is: on a slow engine a document's
//! second question, arriving while the holder is well into the document,
//! looked cheaper to recompute on an idle instance than to wait for, and the
//! copy filled a small cache (issue 30: one such copy was the whole loss of
//! the real-vLLM first pass, 4 points of prompt tokens cached).
//!
//! The model: while any request is queued, the engine computes `rate` prefill
//! tokens a second spread over them (chunked prefill fills each step from
//! every waiting request), so what is left is the queued uncached tokens less
//! `rate × time` since the queue was last seen changing, plus what was done
//! before. A request whose first token comes takes its own tokens back from
//! what was done (they were part of it); one that comes sooner than the rate
//! said leaves nothing done for the rest, one that comes later leaves the
//! excess to the others, never more than is queued. The requests' overheads
//! (a step each) are never drained: they stand until the first token.
//!
//! State: one `u64`, the time the queue last changed (ms, 40 bits: 34 years
//! of the instances' clock) and the tokens done by then (24 bits, saturating
//! at 16.7M), updated with one compare-and-swap when a request joins or
//! leaves the queue; a routing decision reads it and computes, writing
//! nothing.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const DONE_BITS: u32 = 24;
const DONE_MAX: u64 = (1 << DONE_BITS) - 1;
const MARK_MAX: u64 = (1 << (64 - DONE_BITS)) - 1;

fn pack(mark_ms: u64, done: u64) -> u64 {
    (mark_ms.min(MARK_MAX) << DONE_BITS) | done.min(DONE_MAX)
}

fn unpack(v: u64) -> (u64, u64) {
    (v >> DONE_BITS, v & DONE_MAX)
}

/// Tokens computed at `rate` a second from `mark_ms` to `now_ms`.
fn computed(rate: f64, mark_ms: u64, now_ms: u64) -> u64 {
    if !(rate.is_finite() && rate > 0.0) {
        return 0;
    }
    let secs = now_ms.saturating_sub(mark_ms) as f64 / 1e3;
    let t = rate * secs;
    if t >= DONE_MAX as f64 {
        DONE_MAX
    } else {
        t as u64
    }
}

/// The part of one instance's queue believed computed.
#[derive(Debug, Default)]
pub struct Drain {
    state: AtomicU64,
}

impl Drain {
    /// Of `queued` uncached tokens waiting at `now_ms`, those believed
    /// computed at `rate` tokens a second (0 or not finite: none).
    pub fn done(&self, now_ms: u64, queued: u64, rate: f64) -> u64 {
        let (mark, done) = unpack(self.state.load(Relaxed));
        done.saturating_add(computed(rate, mark, now_ms))
            .min(queued)
    }

    /// The queue changes at `now_ms`: `queued` uncached tokens were waiting
    /// until now, and a request whose first token came takes `left` of them
    /// away with it (0 when one joins).
    pub fn change(&self, now_ms: u64, queued: u64, rate: f64, left: u64) {
        let _ = self.state.fetch_update(Relaxed, Relaxed, |v| {
            let (mark, done) = unpack(v);
            let done = done
                .saturating_add(computed(rate, mark, now_ms))
                .min(queued);
            let rest = queued.saturating_sub(left);
            Some(pack(now_ms, done.saturating_sub(left).min(rest)))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_drains_at_the_rate_and_no_further() {
        let d = Drain::default();
        d.change(1_000, 0, 100.0, 0); // a 500-token prompt joins an empty queue
        assert_eq!(d.done(1_000, 500, 100.0), 0);
        assert_eq!(d.done(3_000, 500, 100.0), 200, "2 s at 100 tokens/s");
        assert_eq!(d.done(9_000, 500, 100.0), 500, "never more than is queued");
    }

    #[test]
    fn without_a_rate_nothing_drains() {
        let d = Drain::default();
        d.change(1_000, 0, 0.0, 0);
        assert_eq!(d.done(60_000, 500, 0.0), 0);
        assert_eq!(d.done(60_000, 500, f64::NAN), 0);
        assert_eq!(d.done(60_000, 500, -5.0), 0);
    }

    #[test]
    fn a_first_token_takes_its_own_tokens_back() {
        let d = Drain::default();
        d.change(0, 0, 100.0, 0); // 500 join
        d.change(1_000, 500, 100.0, 0); // 300 more join after 1 s: 100 done
        assert_eq!(d.done(1_000, 800, 100.0), 100);
        // At 6 s the first (500) answers: 600 computed in all, 100 of them
        // on the second.
        d.change(6_000, 800, 100.0, 500);
        assert_eq!(d.done(6_000, 300, 100.0), 100);
        assert_eq!(d.done(7_000, 300, 100.0), 200);
    }

    #[test]
    fn an_early_first_token_leaves_nothing_done_for_the_rest() {
        let d = Drain::default();
        d.change(0, 0, 100.0, 0);
        d.change(0, 500, 100.0, 0);
        // The first answers at 2 s (200 computed, it had 500): the engine
        // was faster on it than the rate says, not ahead on the second.
        d.change(2_000, 1_000, 100.0, 500);
        assert_eq!(d.done(2_000, 500, 100.0), 0);
    }

    #[test]
    fn the_last_request_leaving_empties_it() {
        let d = Drain::default();
        d.change(0, 0, 100.0, 0);
        d.change(60_000, 500, 100.0, 500);
        d.change(61_000, 0, 100.0, 0); // a new request joins an empty queue
        assert_eq!(d.done(61_000, 400, 100.0), 0);
    }

    #[test]
    fn the_clock_going_backwards_computes_nothing() {
        let d = Drain::default();
        d.change(5_000, 0, 100.0, 0);
        assert_eq!(d.done(4_000, 500, 100.0), 0);
    }
}
