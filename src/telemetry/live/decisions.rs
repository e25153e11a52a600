//! [`Decisions`]: the last [`CAPACITY`] routing decisions, in a ring of
//! slots written without a lock: a request takes the next sequence number
//! with one atomic add and swaps its [`Decision`] into that slot
//! (`arc_swap`, lock-free), dropping the one it replaces. Viewers read slots
//! by sequence number; a slot whose writer has not finished yet is read
//! again on the next look, one already overwritten is skipped.
//!
//! A decision holds sizes and hashes only, never the prompt: the routing
//! key, the estimated prompt tokens, the body's length, and the loads the
//! policy saw (from which the console replays the policy's costs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use kvgate_routing::{Load, Request};

pub const CAPACITY: usize = 512;
/// Not known (yet): a stream's first token, an answer's usage.
const UNKNOWN: u64 = u64::MAX;

/// One routing decision, filled in further as its answer streams.
#[derive(Debug)]
pub struct Decision {
    pub seq: u64,
    pub at_ms: u64,
    pub tenant: Arc<str>,
    pub api: &'static str,
    pub endpoint: String,
    pub strategy: &'static str,
    /// The instance that answered; `None` when none could.
    pub instance: Option<String>,
    /// Its index among the endpoint's instances at decision time.
    pub index: Option<usize>,
    /// `cache_hit`, `cold`, …, `failover`, or `unavailable`.
    pub reason: &'static str,
    pub attempts: u32,
    pub stream: bool,
    pub body_bytes: u64,
    /// Leading blocks of the prompt the chosen instance was believed to hold.
    pub matched_blocks: u64,
    /// What the policy was asked and saw (key and prompt estimate; loads).
    pub request: Request,
    pub loads: Vec<Load>,
    ttft_us: AtomicU64,
    cached_tokens: AtomicU64,
    prompt_tokens: AtomicU64,
    duration_us: AtomicU64,
    status: AtomicU16,
}

impl Decision {
    #[expect(
        clippy::too_many_arguments,
        reason = "one record's fields, named at the one call site"
    )]
    pub fn new(
        tenant: Arc<str>,
        (api, endpoint, strategy): (&'static str, &str, &'static str),
        (instance, index): (Option<String>, Option<usize>),
        (reason, attempts): (&'static str, u32),
        stream: bool,
        body_bytes: u64,
        matched_blocks: u64,
        (request, loads): (Request, Vec<Load>),
    ) -> Self {
        Self {
            seq: 0,
            at_ms: super::unix_ms(),
            tenant,
            api,
            endpoint: endpoint.to_owned(),
            strategy,
            instance,
            index,
            reason,
            attempts,
            stream,
            body_bytes,
            matched_blocks,
            request,
            loads,
            ttft_us: AtomicU64::new(UNKNOWN),
            cached_tokens: AtomicU64::new(UNKNOWN),
            prompt_tokens: AtomicU64::new(UNKNOWN),
            duration_us: AtomicU64::new(UNKNOWN),
            status: AtomicU16::new(0),
        }
    }

    pub fn first_token(&self, took: Duration) {
        self.ttft_us.store(micros(took), Relaxed);
    }

    pub fn usage(&self, prompt_tokens: u64, cached_tokens: u64) {
        self.prompt_tokens.store(prompt_tokens, Relaxed);
        self.cached_tokens.store(cached_tokens, Relaxed);
    }

    pub fn done(&self, status: u16, took: Duration) {
        self.status.store(status, Relaxed);
        self.duration_us.store(micros(took), Relaxed);
    }

    pub fn ttft(&self) -> Option<Duration> {
        known(&self.ttft_us).map(Duration::from_micros)
    }

    pub fn duration(&self) -> Option<Duration> {
        known(&self.duration_us).map(Duration::from_micros)
    }

    /// (prompt tokens, cached tokens) as the engine reported them.
    pub fn reported(&self) -> Option<(u64, u64)> {
        Some((known(&self.prompt_tokens)?, known(&self.cached_tokens)?))
    }

    pub fn status(&self) -> Option<u16> {
        Some(self.status.load(Relaxed)).filter(|s| *s != 0)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(UNKNOWN - 1)
}

fn known(a: &AtomicU64) -> Option<u64> {
    Some(a.load(Relaxed)).filter(|v| *v != UNKNOWN)
}

/// The ring.
#[derive(Debug)]
pub struct Decisions {
    slots: Box<[ArcSwapOption<Decision>]>,
    next: AtomicU64,
}

impl Default for Decisions {
    fn default() -> Self {
        Self {
            slots: (0..CAPACITY).map(|_| ArcSwapOption::empty()).collect(),
            next: AtomicU64::new(0),
        }
    }
}

impl Decisions {
    /// Number `d` and put it in the ring; the returned handle fills in its answer.
    pub fn push(&self, mut d: Decision) -> Arc<Decision> {
        let seq = self.next.fetch_add(1, Relaxed);
        d.seq = seq;
        let d = Arc::new(d);
        self.slot(seq).store(Some(Arc::clone(&d)));
        d
    }

    fn slot(&self, seq: u64) -> &ArcSwapOption<Decision> {
        &self.slots[(seq % CAPACITY as u64) as usize]
    }

    /// The sequence number the next decision will get.
    pub fn next_seq(&self) -> u64 {
        self.next.load(Relaxed)
    }

    /// Up to `max` decisions from sequence number `from` on, oldest first,
    /// and where to continue: at the first slot still being written.
    pub fn since(&self, from: u64, max: usize) -> (Vec<Arc<Decision>>, u64) {
        let end = self.next.load(Relaxed);
        let from = from
            .max(end.saturating_sub(CAPACITY as u64))
            .max(end.saturating_sub(max as u64));
        let mut out = Vec::with_capacity(usize::try_from(end - from.min(end)).unwrap_or(0));
        for seq in from..end {
            match self.slot(seq).load_full() {
                Some(d) if d.seq == seq => out.push(d),
                // Overwritten by a later lap: gone.
                Some(d) if d.seq > seq => {}
                // Its writer has the number but has not stored yet.
                _ => return (out, seq),
            }
        }
        (out, end)
    }

    /// Decision `seq`, while the ring still holds it.
    pub fn get(&self, seq: u64) -> Option<Arc<Decision>> {
        self.slot(seq).load_full().filter(|d| d.seq == seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u64) -> Decision {
        Decision::new(
            Arc::from("t"),
            ("chat", "e", "kv_aware"),
            (Some(format!("i{n}")), Some(0)),
            ("cold", 1),
            false,
            n,
            0,
            (Request::with_key(n), Vec::new()),
        )
    }

    #[test]
    fn keeps_the_last_lap_in_order() {
        let ring = Decisions::default();
        for n in 0..(CAPACITY as u64 + 10) {
            ring.push(d(n));
        }
        let (all, next) = ring.since(0, usize::MAX);
        assert_eq!(all.len(), CAPACITY);
        assert_eq!(all[0].seq, 10);
        assert_eq!(next, CAPACITY as u64 + 10);
        assert!(ring.get(3).is_none());
        assert_eq!(ring.get(11).map(|d| d.body_bytes), Some(11));
        let (tail, _) = ring.since(next - 2, usize::MAX);
        assert_eq!(
            tail.iter().map(|d| d.seq).collect::<Vec<_>>(),
            [next - 2, next - 1]
        );
        let (last, _) = ring.since(0, 3);
        assert_eq!(last.len(), 3);
    }

    #[test]
    fn an_unfinished_slot_stops_the_read_until_it_is_written() {
        let ring = Decisions::default();
        ring.push(d(0));
        // A writer that has taken number 1 but not stored it yet.
        ring.next.fetch_add(1, Relaxed);
        let (seen, next) = ring.since(0, usize::MAX);
        assert_eq!((seen.len(), next), (1, 1));
    }

    #[test]
    fn late_fields_fill_in() {
        let ring = Decisions::default();
        let h = ring.push(d(0));
        assert!(h.ttft().is_none() && h.reported().is_none() && h.status().is_none());
        h.first_token(Duration::from_millis(12));
        h.usage(100, 64);
        h.done(200, Duration::from_millis(30));
        let got = ring.get(0).unwrap();
        assert_eq!(got.ttft(), Some(Duration::from_millis(12)));
        assert_eq!(got.reported(), Some((100, 64)));
        assert_eq!(got.status(), Some(200));
    }
}
