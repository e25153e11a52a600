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
            pace_ahead: None,
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
    /// sample of the instance's pace.
    pace_ahead: Option<Ahead>,
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
    /// API sends two events before prefill starts): a sample of the
    /// instance's pace, if [`Self::time_first_token`] asked for one.
    pub fn first_token(&mut self) {
        if let Some(ahead) = self.pace_ahead.take() {
            self.instance
                .pace
                .observe(ahead, self.claimed.elapsed().as_secs_f64());
        }
    }

    /// Time this request's first token as a sample of the instance's pace
    /// (a streamed answer, its uncached tokens estimated from an index):
    /// what stood before it, its own uncached tokens among them.
    pub fn time_first_token(&mut self, ahead: Ahead) {
        self.pace_ahead = Some(ahead);
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
        self.prefill_done();
        let prev = self.instance.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.instance.series.in_flight(prev.saturating_sub(1));
        self.instance.engine.finished();
        if let Some(hook) = self.instance.freed.get().and_then(Weak::upgrade) {
            hook.freed();
        }
    }
}
