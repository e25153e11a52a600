//! An instance's load as its engine reports it on `/metrics`: requests
//! running and waiting for a batch slot (`vllm:num_requests_running`,
//! `vllm:num_requests_waiting`; SGLang's `sglang:num_running_reqs`,
//! `sglang:num_queue_reqs`) and the KV cache's fill (`vllm:kv_cache_usage_perc`,
//! vLLM < 0.10's `vllm:gpu_cache_usage_perc`, SGLang's `sglang:token_usage`),
//! read by `queue::engine_poll` for cache-aware endpoints and while queueing
//! is on. A reading older than [`STALE`] is not believed: an engine that
//! stops answering `/metrics` is judged by the gateway's own counts alone.
//!
//! Three uses. *Routing*: an instance's requests in flight are at least what
//! its engine last counted running and waiting, plus what this replica sent
//! since — the same truth for every replica, which each replica's own counts
//! only fill in between readings. *Saturated*: the last reading shows more than `max_waiting`
//! requests waiting or the KV cache at `max_kv_usage`. *Room* for requests
//! the gateway holds back: `max_waiting + 1 − waiting − (sent − finished
//! since the reading)`, so one reading of a freed engine lets one request
//! through, each request that ends there makes room for one more, and the
//! engine is kept busy without a queue of its own; a full KV cache takes
//! nothing.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How long a reading stands.
pub const STALE: Duration = Duration::from_secs(5);

/// One reading of an engine's `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Reading {
    pub waiting: u64,
    pub running: u64,
    /// 0–1.
    pub kv_usage: f64,
}

/// The latest reading; all zero until the first.
#[derive(Debug, Default)]
pub struct EngineLoad {
    waiting: AtomicU64,
    running: AtomicU64,
    /// KV usage in millionths.
    kv_usage_ppm: AtomicU32,
    /// When it was read, in the instance clock's milliseconds (0: never).
    read_at_ms: AtomicU64,
    /// Requests sent to the instance and ended there, ever, and as of the
    /// last reading.
    sent: AtomicU64,
    sent_at_read: AtomicU64,
    finished: AtomicU64,
    finished_at_read: AtomicU64,
    /// A reading has failed (logged once per instance).
    failed: std::sync::atomic::AtomicBool,
}

impl EngineLoad {
    /// A request was sent to the instance.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A request sent there ended (or was given up).
    pub fn finished(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
    }

    /// A reading failed: whether it is the first to (to be logged).
    pub fn failed_first(&self) -> bool {
        !self.failed.swap(true, Ordering::Relaxed)
    }

    pub fn set(&self, r: Reading, now_ms: u64) {
        let now_ms = now_ms.max(1);
        self.sent_at_read
            .store(self.sent.load(Ordering::Relaxed), Ordering::Relaxed);
        self.finished_at_read
            .store(self.finished.load(Ordering::Relaxed), Ordering::Relaxed);
        self.waiting.store(r.waiting, Ordering::Relaxed);
        self.running.store(r.running, Ordering::Relaxed);
        let ppm = (r.kv_usage.clamp(0.0, 1.0) * 1e6) as u32;
        self.kv_usage_ppm.store(ppm, Ordering::Relaxed);
        self.read_at_ms.store(now_ms, Ordering::Relaxed);
    }

    /// The last reading, when taken within [`STALE`] of `now_ms`.
    pub fn reading(&self, now_ms: u64) -> Option<Reading> {
        let at = self.read_at_ms.load(Ordering::Relaxed);
        let fresh = at > 0 && now_ms.saturating_sub(at) <= STALE.as_millis() as u64;
        fresh.then(|| Reading {
            waiting: self.waiting.load(Ordering::Relaxed),
            running: self.running.load(Ordering::Relaxed),
            kv_usage: f64::from(self.kv_usage_ppm.load(Ordering::Relaxed)) / 1e6,
        })
    }

    /// Requests on the engine as its last fresh reading counted them
    /// (running and waiting), plus those this replica sent there since and
    /// that have not ended: what routing weighs as its in-flight count at
    /// least. `None` without a fresh reading.
    pub fn in_flight_since_reading(&self, now_ms: u64) -> Option<u64> {
        let r = self.reading(now_ms)?;
        let net = self.net_since_reading();
        let on_engine = i128::from(r.running) + i128::from(r.waiting) + net;
        Some(u64::try_from(on_engine.max(0)).unwrap_or(u64::MAX))
    }

    /// Sent less ended since the last reading (negative when more ended).
    fn net_since_reading(&self) -> i128 {
        let since = |total: &AtomicU64, at: &AtomicU64| {
            i128::from(total.load(Ordering::Relaxed)) - i128::from(at.load(Ordering::Relaxed))
        };
        since(&self.sent, &self.sent_at_read) - since(&self.finished, &self.finished_at_read)
    }

    /// Whether the last reading says saturated (see the module docs);
    /// without a fresh reading, no.
    pub fn saturated(&self, max_waiting: u64, max_kv_usage: f64, now_ms: u64) -> bool {
        self.reading(now_ms)
            .is_some_and(|r| r.waiting > max_waiting || r.kv_usage >= max_kv_usage)
    }

    /// How many requests held back may go to the engine now (see the
    /// module docs); `None` without a fresh reading.
    pub fn room(&self, max_waiting: u64, max_kv_usage: f64, now_ms: u64) -> Option<u64> {
        let r = self.reading(now_ms)?;
        if r.kv_usage >= max_kv_usage {
            return Some(0);
        }
        let net = self.net_since_reading();
        let room = i128::from(max_waiting) + 1 - i128::from(r.waiting) - net;
        Some(u64::try_from(room.max(0)).unwrap_or(u64::MAX))
    }
}

/// An instance's `/metrics` page, headers and body within `timeout` (a
/// stalled one must not hold up the others); `None` on any failure.
pub async fn fetch_metrics(
    client: &reqwest::Client,
    instance_url: &str,
    timeout: Duration,
) -> Option<String> {
    let fetch = async {
        let r = client
            .get(format!("{instance_url}/metrics"))
            .send()
            .await
            .ok()?;
        r.status().is_success().then_some(())?;
        r.text().await.ok()
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}

/// A reading from a Prometheus text exposition, counts summed over label
/// sets (an engine serving several models); `None` when it has none of
/// the families.
pub fn parse(text: &str) -> Option<Reading> {
    let (mut r, mut seen) = (Reading::default(), false);
    let (mut waiting, mut running) = (0.0f64, 0.0f64);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let value = || line.rsplit(' ').next()?.parse::<f64>().ok();
        match name {
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => {
                waiting += value().unwrap_or(0.0);
            }
            "vllm:num_requests_running" | "sglang:num_running_reqs" => {
                running += value().unwrap_or(0.0);
            }
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
                r.kv_usage = r.kv_usage.max(value().unwrap_or(0.0));
            }
            _ => continue,
        }
        seen = true;
    }
    r.waiting = waiting.max(0.0) as u64;
    r.running = running.max(0.0) as u64;
    seen.then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(waiting: u64, running: u64, kv_usage: f64) -> Reading {
        Reading {
            waiting,
            running,
            kv_usage,
        }
    }

    #[test]
    fn reads_vllm_and_sglang() {
        let vllm = "# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\nvllm:num_requests_running{engine=\"0\"} 8.0\n";
        assert_eq!(parse(vllm), Some(reading(3, 8, 0.25)));
        let sglang =
            "sglang:num_queue_reqs{a=\"b\"} 2\nsglang:num_running_reqs 4\nsglang:token_usage 0.5\n";
        assert_eq!(parse(sglang), Some(reading(2, 4, 0.5)));
        assert_eq!(parse("other 1\n"), None);
    }

    #[test]
    fn room_is_a_slot_per_request_ended_once_the_engine_queues() {
        let l = EngineLoad::default();
        assert_eq!(l.room(0, 0.95, 10), None, "no reading");
        assert!(!l.saturated(0, 0.95, 10));
        l.set(reading(0, 3, 0.2), 1000);
        assert!(!l.saturated(0, 0.95, 1000));
        assert_eq!(l.room(0, 0.95, 1000), Some(1));
        l.sent();
        assert_eq!(l.room(0, 0.95, 1000), Some(0));
        // The engine queues: saturated, no room until requests end there.
        l.set(reading(2, 4, 0.5), 2000);
        assert!(l.saturated(0, 0.95, 2000));
        assert!(!l.saturated(2, 0.95, 2000), "max_waiting 2 allows it");
        assert_eq!(l.room(0, 0.95, 2000), Some(0));
        l.finished();
        l.finished();
        assert_eq!(l.room(0, 0.95, 2000), Some(1));
        l.sent();
        assert_eq!(l.room(0, 0.95, 2000), Some(0));
        // A full cache takes nothing; a stale reading is no reading.
        assert_eq!(l.room(9, 0.5, 2000), Some(0));
        assert!(l.saturated(9, 0.5, 2000));
        assert_eq!(l.room(0, 0.95, 2000 + STALE.as_millis() as u64 + 1), None);
    }
}
