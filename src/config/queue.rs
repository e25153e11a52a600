//! `queue`: fair queueing in the gateway when every instance of an endpoint
//! is saturated (the priorities it orders by are tenants', `tenancy::priority`).

use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueue {
    pub enabled: Option<bool>,
    pub max_in_flight: Option<u64>,
    pub max_waiting: Option<u64>,
    pub max_kv_usage: Option<f64>,
    pub engine_poll_ms: Option<u64>,
    pub max_length: Option<u64>,
    pub max_wait_ms: Option<u64>,
    pub input_weight: Option<f64>,
    pub output_weight: Option<f64>,
    pub priority_header: Option<String>,
}

/// Validated `queue`.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Off: every request passes straight on, as without this section.
    pub enabled: bool,
    /// The gateway's own bound: an instance with this many requests in
    /// flight is saturated.
    pub max_in_flight: usize,
    /// An instance whose engine reports more waiting requests is saturated.
    pub max_waiting: u64,
    /// An instance whose engine reports this KV-cache usage (0–1) is saturated.
    pub max_kv_usage: f64,
    /// How often engines' `/metrics` are read while queueing is on.
    pub engine_poll: Duration,
    /// Most requests waiting at once; one more is refused at once.
    pub max_length: usize,
    /// Longest wait; then 429 (503 on SageMaker routes) with `retry-after`.
    pub max_wait: Duration,
    /// Service counted per input and per output token (VTC's weights).
    pub input_weight: f64,
    pub output_weight: f64,
    /// The header a permitted tenant may lower (or restate) its priority with.
    pub priority_header: axum::http::HeaderName,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            // vLLM's own max_num_seqs: the engine's readings say when it is
            // saturated; this bounds what its first reading lets through.
            max_in_flight: 256,
            max_waiting: 0,
            max_kv_usage: 0.98,
            engine_poll: Duration::from_millis(250),
            max_length: 1024,
            max_wait: Duration::from_secs(30),
            input_weight: 1.0,
            output_weight: 2.0,
            priority_header: axum::http::HeaderName::from_static("x-kvgate-priority"),
        }
    }
}

pub(super) fn validate(raw: Option<RawQueue>) -> Result<QueueConfig, ConfigError> {
    let d = QueueConfig::default();
    let Some(raw) = raw else { return Ok(d) };
    let range = |name: &str, v: Option<u64>, lo: u64, hi: u64, default: u64| {
        let v = v.unwrap_or(default);
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(ConfigError::new(
                format!("queue.{name}"),
                format!("{v} is outside {lo}..={hi}"),
            ))
        }
    };
    let weight = |name: &str, v: Option<f64>, default: f64| match v.unwrap_or(default) {
        w if (0.0..=1e6).contains(&w) => Ok(w),
        w => Err(ConfigError::new(
            format!("queue.{name}"),
            format!("{w} is not a weight in 0..=1000000"),
        )),
    };
    let max_kv_usage = match raw.max_kv_usage.unwrap_or(d.max_kv_usage) {
        u if u > 0.0 && u <= 1.0 => u,
        u => {
            return Err(ConfigError::new(
                "queue.max_kv_usage",
                format!("{u} is not a fraction in (0, 1]"),
            ));
        }
    };
    let priority_header = match raw.priority_header {
        None => d.priority_header,
        Some(h) => {
            axum::http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()).map_err(|_| {
                ConfigError::new(
                    "queue.priority_header",
                    format!("{h:?} is not a header name"),
                )
            })?
        }
    };
    let to_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok(QueueConfig {
        enabled: raw.enabled.unwrap_or(true),
        max_in_flight: to_usize(range(
            "max_in_flight",
            raw.max_in_flight,
            1,
            1_000_000,
            d.max_in_flight as u64,
        )?),
        max_waiting: range("max_waiting", raw.max_waiting, 0, 1_000_000, 0)?,
        max_kv_usage,
        // Readings go stale after 5 s (upstream::engine_load::STALE).
        engine_poll: Duration::from_millis(range(
            "engine_poll_ms",
            raw.engine_poll_ms,
            10,
            2_000,
            250,
        )?),
        max_length: to_usize(range("max_length", raw.max_length, 1, 10_000_000, 1024)?),
        max_wait: Duration::from_millis(range(
            "max_wait_ms",
            raw.max_wait_ms,
            1,
            3_600_000,
            30_000,
        )?),
        input_weight: weight("input_weight", raw.input_weight, d.input_weight)?,
        output_weight: weight("output_weight", raw.output_weight, d.output_weight)?,
        priority_header,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors_name_the_field() {
        assert!(!validate(None).unwrap().enabled);
        assert!(validate(Some(RawQueue::default())).unwrap().enabled);
        let bad = |raw: RawQueue| validate(Some(raw)).unwrap_err().field;
        assert_eq!(
            bad(RawQueue {
                input_weight: Some(-1.0),
                ..Default::default()
            }),
            "queue.input_weight"
        );
        assert_eq!(
            bad(RawQueue {
                max_in_flight: Some(0),
                ..Default::default()
            }),
            "queue.max_in_flight"
        );
        assert_eq!(
            bad(RawQueue {
                max_kv_usage: Some(1.5),
                ..Default::default()
            }),
            "queue.max_kv_usage"
        );
        assert_eq!(
            bad(RawQueue {
                priority_header: Some("a b".into()),
                ..Default::default()
            }),
            "queue.priority_header"
        );
    }
}
