//! An instance's load as its engine reports it on `/metrics`: requests
//! waiting for a batch slot (`vllm:num_requests_waiting`, SGLang's
//! `sglang:num_queue_reqs`) and the KV cache's fill (`vllm:kv_cache_usage_perc`,
//! vLLM < 0.10's `vllm:gpu_cache_usage_perc`, SGLang's `sglang:token_usage`),
//! read by `queue::engine_poll` while queueing is on. A figure older than
//! [`STALE`] is not believed: an engine that stops answering `/metrics` is
//! judged by the gateway's own in-flight bound alone.
//!
//! Between readings the gateway counts what it sent since the last one, so
//! one reading of "nobody waiting" lets `max_waiting + 1` requests through,
//! not the whole queue: the engine's room is
//! `max_waiting + 1 − waiting − sent since the reading`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How long a reading stands.
pub const STALE: Duration = Duration::from_secs(5);

/// The latest reading; all zero until the first.
#[derive(Debug, Default)]
pub struct EngineLoad {
    waiting: AtomicU64,
    /// KV usage in millionths.
    kv_usage_ppm: AtomicU32,
    /// When it was read, in the instance clock's milliseconds (0: never).
    read_at_ms: AtomicU64,
    /// Requests sent to the instance, ever, and as of the last reading.
    sent: AtomicU64,
    sent_at_read: AtomicU64,
}

impl EngineLoad {
    /// A request was sent to the instance.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// How many more requests the engine takes before more than
    /// `max_waiting` wait, or 0 with its KV cache at `max_kv_usage`; `None`
    /// without a fresh reading.
    pub fn room(&self, max_waiting: u64, max_kv_usage: f64, now_ms: u64) -> Option<u64> {
        let (waiting, kv) = self.reading(now_ms)?;
        if kv >= max_kv_usage {
            return Some(0);
        }
        let since = self
            .sent
            .load(Ordering::Relaxed)
            .saturating_sub(self.sent_at_read.load(Ordering::Relaxed));
        Some((max_waiting + 1).saturating_sub(waiting.saturating_add(since)))
    }

    pub fn set(&self, waiting: u64, kv_usage: f64, now_ms: u64) {
        self.sent_at_read
            .store(self.sent.load(Ordering::Relaxed), Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
        let ppm = (kv_usage.clamp(0.0, 1.0) * 1e6) as u32;
        self.kv_usage_ppm.store(ppm, Ordering::Relaxed);
        self.read_at_ms.store(now_ms.max(1), Ordering::Relaxed);
    }

    /// (waiting, KV usage) when read within [`STALE`] of `now_ms`.
    pub fn reading(&self, now_ms: u64) -> Option<(u64, f64)> {
        let at = self.read_at_ms.load(Ordering::Relaxed);
        let fresh = at > 0 && now_ms.saturating_sub(at) <= STALE.as_millis() as u64;
        fresh.then(|| {
            (
                self.waiting.load(Ordering::Relaxed),
                f64::from(self.kv_usage_ppm.load(Ordering::Relaxed)) / 1e6,
            )
        })
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

/// (waiting requests, KV usage 0–1) from a Prometheus text exposition,
/// summed over label sets (an engine serving several models); `None` when
/// neither family is there.
pub fn parse(text: &str) -> Option<(u64, f64)> {
    let (mut waiting, mut usage, mut seen) = (0.0f64, 0.0f64, false);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let value = || line.rsplit(' ').next()?.parse::<f64>().ok();
        match name {
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => {
                waiting += value().unwrap_or(0.0);
                seen = true;
            }
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
                usage = usage.max(value().unwrap_or(0.0));
                seen = true;
            }
            _ => {}
        }
    }
    seen.then(|| (waiting.max(0.0) as u64, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_and_sglang_and_forgets_stale_readings() {
        let vllm = "# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\nvllm:num_requests_running{engine=\"0\"} 8.0\n";
        assert_eq!(parse(vllm), Some((3, 0.25)));
        assert_eq!(
            parse("sglang:num_queue_reqs{a=\"b\"} 2\nsglang:token_usage 0.5\n"),
            Some((2, 0.5))
        );
        assert_eq!(parse("other 1\n"), None);
        let l = EngineLoad::default();
        assert_eq!(l.reading(10), None);
        l.set(4, 0.9, 1000);
        assert_eq!(l.reading(1500), Some((4, 0.9)));
        assert_eq!(l.room(0, 0.95, 1500), Some(0));
        l.set(0, 0.5, 2000);
        assert_eq!(l.room(1, 0.95, 2000), Some(2));
        l.sent();
        assert_eq!(l.room(1, 0.95, 2000), Some(1));
        assert_eq!(l.room(1, 0.5, 2000), Some(0), "a full cache takes nothing");
        assert_eq!(l.reading(2000 + STALE.as_millis() as u64 + 1), None);
    }
}
