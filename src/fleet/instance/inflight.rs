//! Claiming an instance for one request, and the [`InflightGuard`] that
//! gives the claim back: its in-flight slot when it drops, its queued
//! prefill at the first body byte or once the learned rate says the engine
//! has drained it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::{Instance, now_ms};
use kvgate_routing::pace::Ahead;

impl Instance {
    /// A queued charge of `p` tokens (`overhead` of them the request's
    /// overhead) given back; 0: already given back.
    fn dequeue(&self, p: u64, overhead: u64) {
        if p > 0 {
            self.queue_changes(p.saturating_sub(overhead));
            self.queued_prefill.fetch_sub(p, Ordering::Relaxed);
            self.queued_requests.fetch_sub(1, Ordering::Relaxed);
            self.queued_uncached
                .fetch_sub(p.saturating_sub(overhead), Ordering::Relaxed);
        }
    }

    /// Count one more request in flight until the guard drops, and `prefill`
    /// more tokens queued until [`InflightGuard::prefill_done`].
    pub fn claim(self: &Arc<Self>, prefill: u64) -> InflightGuard {
        let n = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.engine.sent();
        let overhead = self.pace.overhead_tokens().min(prefill);
        if prefill > 0 {
            self.queue_changes(0);
            self.queued_prefill.fetch_add(prefill, Ordering::Relaxed);
            self.queued_requests.fetch_add(1, Ordering::Relaxed);
            self.queued_uncached
                .fetch_add(prefill - overhead, Ordering::Relaxed);
        }
        self.recent_work.add(prefill, now_ms());
        self.series.in_flight(n);
        InflightGuard {
            instance: Arc::clone(self),
            prefill: Arc::new(AtomicU64::new(prefill)),
            overhead,
            claimed: Instant::now(),
            index_insert: None,
            pace_sample: None,
        }
    }
}

/// One in-flight slot on an instance, released on drop.
#[derive(Debug)]
pub struct InflightGuard {
    instance: Arc<Instance>,
    /// Queued-prefill tokens not yet given back (shared with a timer that
    /// may give them back first; whoever takes them subtracts them).
    prefill: Arc<AtomicU64>,
    /// The part of that charge that was the instance's overhead.
    overhead: u64,
    claimed: Instant,
    /// Its insert into the instance's block index, settled with the prefill.
    index_insert: Option<u64>,
    /// What its first token waits for, when that first token's time is a
    /// sample of the instance's pace: kept until the answer's usage can
    /// recount it in the engine's tokens ([`Self::answered`]).
    pace_sample: Option<PaceSample>,
}

/// A first token's time as a sample of the instance's pace, and the
/// estimates it rests on ([`Ahead::recounted`]).
#[derive(Debug, Clone, Copy)]
pub struct PaceSample {
    pub ahead: Ahead,
    /// The request's whole prompt, estimated.
    pub prompt: u64,
    /// Seconds from the claim to its first token, once it came.
    pub secs: Option<f64>,
}

impl InflightGuard {
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }

    /// The request's prefill is over (its first byte came): stop counting it
    /// as queued, and let later hits on its blocks count as settled
    /// ([`BlockIndex::settle`]). Idempotent.
    pub fn prefill_done(&mut self) {
        let p = self.prefill.swap(0, Ordering::Relaxed);
        self.instance.dequeue(p, self.overhead);
        if let Some(stamp) = self.index_insert.take() {
            self.instance.index.settle(stamp);
        }
    }

    /// The answer's first byte: its prefill is over, and how long it took
    /// shows the instance's prefill rate (see [`super::prefill_rate`]).
    pub fn first_byte(&mut self) {
        let p = self.prefill.load(Ordering::Relaxed);
        if p > 0 {
            let uncached = p.saturating_sub(self.instance.pace.overhead_tokens());
            self.instance
                .prefill_rate
                .observe(uncached, self.claimed.elapsed());
        }
        self.prefill_done();
    }

    /// The streamed answer's first token (not its first byte: the Responses
    /// API sends two events before prefill starts): its time is kept as a
    /// sample of the instance's pace, if [`Self::time_first_token`] asked
    /// for one, to be taken when the answer ends.
    pub fn first_token(&mut self) {
        if let Some(s) = self.pace_sample.as_mut().filter(|s| s.secs.is_none()) {
            s.secs = Some(self.claimed.elapsed().as_secs_f64());
        }
    }

    /// Time this request's first token as a sample of the instance's pace
    /// (a streamed answer, its uncached tokens estimated from an index).
    pub fn time_first_token(&mut self, sample: PaceSample) {
        self.pace_sample = Some(sample);
    }

    /// The answer ended, saying how many tokens its engine counted in the
    /// prompt (`usage.prompt_tokens`), if it did: its first token's sample is
    /// taken, recounted in the engine's units where the usage allows, as
    /// estimated where it does not.
    pub fn answered(&mut self, prompt_tokens: Option<u64>) {
        let Some(s) = self.pace_sample.take() else {
            return;
        };
        let Some(secs) = s.secs else { return };
        let ahead = match prompt_tokens {
            Some(n) => s.ahead.recounted(s.prompt, n),
            None => s.ahead,
        };
        self.instance.pace.observe(ahead, secs);
    }

    /// An answer that will not say when its prefill ends (not streamed):
    /// give its charge back once `queued_ahead` tokens and its own have
    /// drained at the instance's prefill rate, if it has shown one.
    pub fn release_at_drain(&self, queued_ahead: u64) {
        let charge = self.prefill.load(Ordering::Relaxed);
        let Some(after) = self
            .instance
            .prefill_rate
            .drain_time(queued_ahead.saturating_add(charge))
        else {
            return;
        };
        let (cell, instance) = (Arc::clone(&self.prefill), Arc::clone(&self.instance));
        let overhead = self.overhead;
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let p = cell.swap(0, Ordering::Relaxed);
            instance.dequeue(p, overhead);
        });
    }

    /// The request's blocks went into the instance's index as insert `stamp`.
    pub fn inserted(&mut self, stamp: u64) {
        self.index_insert = Some(stamp);
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        // An answer cut short after its first token: its time stands as
        // estimated.
        self.answered(None);
        self.prefill_done();
        let prev = self.instance.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.instance.series.in_flight(prev.saturating_sub(1));
        self.instance.engine.finished();
        if let Some(hook) = self.instance.freed.get().and_then(Weak::upgrade) {
            hook.freed();
        }
    }
}
