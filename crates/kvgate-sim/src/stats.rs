//! Counters and gauges shared between the engine (one writer) and readers
//! (`stats()`, `/metrics`), as relaxed atomics: a snapshot is per-field consistent.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// A snapshot of one instance's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimStats {
    /// Valid requests received (counted on arrival, before queueing).
    pub requests: u64,
    /// Prompt tokens of those requests.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache (vLLM `prefix_cache_hits`), counted on admission.
    pub cached_tokens: u64,
    /// Prompt tokens looked up in the prefix cache (vLLM `prefix_cache_queries`), counted on admission.
    pub queries_tokens: u64,
    /// Sequences running now.
    pub running: usize,
    /// Requests waiting for admission now.
    pub waiting: usize,
    /// Requests whose client went away before they finished.
    pub aborted: u64,
    /// Output tokens generated.
    pub generation_tokens: u64,
    /// KV blocks held by running sequences now.
    pub kv_blocks_in_use: usize,
    /// KV capacity in blocks.
    pub kv_blocks_total: usize,
}

/// Every request's times on the simulated clock, from its arrival, in seconds,
/// each with the number at the end of its response's id: exact where
/// `/metrics`' histogram is bucketed, and per request (what a benchmark's
/// percentiles and per-client sums need). A few bytes a request, kept for
/// the server's life.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Latencies {
    /// Time to first token, in the order first tokens came.
    pub ttft: Vec<(u64, f64)>,
    /// Time to the last token, in the order requests finished.
    pub e2e: Vec<(u64, f64)>,
}

/// vLLM's `time_to_first_token_seconds` bucket bounds.
pub(crate) const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub requests: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub queries_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub aborted: AtomicU64,
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub kv_in_use: AtomicUsize,
    pub kv_total: AtomicUsize,
    /// Non-cumulative counts per TTFT bucket, the last one for +Inf.
    pub ttft_buckets: [AtomicU64; TTFT_BUCKETS.len() + 1],
    pub ttft_sum_ns: AtomicU64,
    pub latencies: Mutex<Latencies>,
}

pub(crate) fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Relaxed);
}

impl Counters {
    /// Record one time to first token, in simulated time.
    pub(crate) fn observe_ttft(&self, serial: u64, ttft: Duration) {
        let secs = ttft.as_secs_f64();
        let i = TTFT_BUCKETS.partition_point(|&le| le < secs);
        if let Some(b) = self.ttft_buckets.get(i) {
            b.fetch_add(1, Relaxed);
        }
        let ns = u64::try_from(ttft.as_nanos()).unwrap_or(u64::MAX);
        self.ttft_sum_ns.fetch_add(ns, Relaxed);
        if let Ok(mut l) = self.latencies.lock() {
            l.ttft.push((serial, secs));
        }
    }

    /// Record one request's time to its last token, in simulated time.
    pub(crate) fn observe_done(&self, serial: u64, e2e: Duration) {
        if let Ok(mut l) = self.latencies.lock() {
            l.e2e.push((serial, e2e.as_secs_f64()));
        }
    }

    pub(crate) fn latencies(&self) -> Latencies {
        self.latencies.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub(crate) fn snapshot(&self) -> SimStats {
        SimStats {
            requests: self.requests.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            cached_tokens: self.cached_tokens.load(Relaxed),
            queries_tokens: self.queries_tokens.load(Relaxed),
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            aborted: self.aborted.load(Relaxed),
            generation_tokens: self.generation_tokens.load(Relaxed),
            kv_blocks_in_use: self.kv_in_use.load(Relaxed),
            kv_blocks_total: self.kv_total.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttft_lands_in_the_first_bucket_whose_bound_is_not_below_it() {
        let c = Counters::default();
        c.observe_ttft(0, Duration::from_millis(100)); // le=0.1
        c.observe_ttft(1, Duration::from_millis(101)); // le=0.25
        c.observe_ttft(2, Duration::from_secs(5000)); // +Inf
        let counts: Vec<u64> = c.ttft_buckets.iter().map(|b| b.load(Relaxed)).collect();
        assert_eq!(counts[7], 1);
        assert_eq!(counts[8], 1);
        assert_eq!(counts[22], 1);
        assert_eq!(counts.iter().sum::<u64>(), 3);
        assert_eq!(c.latencies().ttft.last(), Some(&(2, 5000.0)));
    }
}
