//! The `kv_aware` keys of an endpoint's `routing:` (tokenizer, block size,
//! tiers, event sockets, warm-up) and of its instances (`kv_events`,
//! `kv_replay`), validated. The tokenizer is loaded here, so a bad path or
//! template is a config error at load or reload, never a request error.

use std::sync::Arc;
use std::time::Duration;

use kvgate_tokenize::PromptTokenizer;

use super::raw::{RawRouting, RawWarmup};
use super::{ConfigError, InstanceConfig};

pub const DEFAULT_BLOCK_SIZE: u64 = 16;
/// An offloaded block must be copied back over PCIe before use: far cheaper
/// than recomputing it, dearer than a GPU hit.
pub const DEFAULT_CPU_TIER_WEIGHT: f64 = 0.8;
/// A block in a shared store crosses the network first.
pub const DEFAULT_SHARED_TIER_WEIGHT: f64 = 0.5;
pub const DEFAULT_SILENCE_MS: u64 = 10_000;
pub const DEFAULT_WARMUP_TIMEOUT_MS: u64 = 30_000;

/// A KV tier every instance can load from.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedTier {
    pub kv_events: String,
    pub kv_replay: Option<String>,
    pub weight: f64,
}

#[derive(Debug, Clone)]
pub struct KvAwareConfig {
    /// Tokens per engine block (vLLM `--block-size`).
    pub block_size: usize,
    pub tokenizer: Arc<PromptTokenizer>,
    /// `tokenizer:` and `chat_template:` as written.
    pub tokenizer_spec: (String, Option<String>),
    pub cpu_weight: f64,
    pub shared: Option<SharedTier>,
    pub events_port: Option<u16>,
    pub replay_port: Option<u16>,
    pub silence: Duration,
}

impl KvAwareConfig {
    /// The tokenizer and where its chat template came from, as `kvgate check`
    /// prints it: a template found in the wrong place (or not found) silently
    /// costs every chat request its event routing.
    pub fn describe_tokenizer(&self) -> String {
        let t = &self.tokenizer;
        let template = match (t.chat_template_source(), t.tool_use_template_source()) {
            (Some(default), None) => format!("with chat template {default}"),
            (Some(default), Some(tools)) => {
                format!("with chat template {default} (requests with tools: {tools})")
            }
            (None, Some(tools)) => format!(
                "with a chat template only for requests with tools, {tools} (the rest use the approximate index)"
            ),
            (None, None) => "(no chat template: chat requests use the approximate index; routing.chat_template names one)".to_owned(),
        };
        format!("tokenizer {} {template}", t.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmupConfig {
    pub prefixes: usize,
    pub timeout: Duration,
}

fn weight(at: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    let w = v.unwrap_or(default);
    if (0.0..=1.0).contains(&w) {
        Ok(w)
    } else {
        Err(ConfigError::new(
            at,
            format!("{w} must be between 0 (never counts) and 1 (counts as a GPU hit)"),
        ))
    }
}

/// A ZeroMQ endpoint kvgate can connect to.
pub fn zmq_endpoint(at: &str, url: &str) -> Result<String, ConfigError> {
    let ok = url
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(url.to_owned())
    } else {
        Err(ConfigError::new(
            at,
            format!(
                "{url:?} is not a tcp://HOST:PORT ZeroMQ endpoint (vLLM's publisher binds tcp://*:5557)"
            ),
        ))
    }
}

/// The `kv_aware` settings, or `None` for other strategies (whose files may
/// not set them: a `tokenizer` under `longest_prefix` is a mistake worth naming).
pub fn kv_aware(
    at: &str,
    kv_aware: bool,
    raw: &RawRouting,
) -> Result<Option<KvAwareConfig>, ConfigError> {
    let f = |name: &str| format!("{at}.{name}");
    if !kv_aware {
        let stray = [
            ("block_size", raw.block_size.is_some()),
            ("tokenizer", raw.tokenizer.is_some()),
            ("chat_template", raw.chat_template.is_some()),
            ("cpu_tier_weight", raw.cpu_tier_weight.is_some()),
            ("shared_tier", raw.shared_tier.is_some()),
            ("kv_events_port", raw.kv_events_port.is_some()),
            ("kv_replay_port", raw.kv_replay_port.is_some()),
            ("kv_events_silence_ms", raw.kv_events_silence_ms.is_some()),
        ];
        if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(ConfigError::new(
                f(name),
                "only the kv_aware strategy uses this key",
            ));
        }
        return Ok(None);
    }
    let block_size = raw.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    if !(1..=4096).contains(&block_size) {
        return Err(ConfigError::new(
            f("block_size"),
            format!("{block_size} must be between 1 and 4096, and equal vLLM's --block-size"),
        ));
    }
    let Some(spec) = raw.tokenizer.clone() else {
        return Err(ConfigError::new(
            f("tokenizer"),
            "kv_aware needs the model's tokenizer: a tokenizer.json path, or tiktoken:<encoding>",
        ));
    };
    let spec = (spec, raw.chat_template.clone());
    let tokenizer = Arc::new(
        PromptTokenizer::load(&spec.0, spec.1.as_deref().map(std::path::Path::new))
            .map_err(|e| ConfigError::new(f("tokenizer"), e.to_string()))?,
    );
    let shared = match &raw.shared_tier {
        None => None,
        Some(t) => Some(SharedTier {
            kv_events: zmq_endpoint(&f("shared_tier.kv_events"), &t.kv_events)?,
            kv_replay: t
                .kv_replay
                .as_deref()
                .map(|u| zmq_endpoint(&f("shared_tier.kv_replay"), u))
                .transpose()?,
            weight: weight(
                &f("shared_tier.weight"),
                t.weight,
                DEFAULT_SHARED_TIER_WEIGHT,
            )?,
        }),
    };
    let silence = raw.kv_events_silence_ms.unwrap_or(DEFAULT_SILENCE_MS);
    if !(100..=3_600_000).contains(&silence) {
        return Err(ConfigError::new(
            f("kv_events_silence_ms"),
            format!("{silence} must be between 100 and 3600000"),
        ));
    }
    Ok(Some(KvAwareConfig {
        block_size: usize::try_from(block_size).unwrap_or(16),
        tokenizer,
        tokenizer_spec: spec,
        cpu_weight: weight(
            &f("cpu_tier_weight"),
            raw.cpu_tier_weight,
            DEFAULT_CPU_TIER_WEIGHT,
        )?,
        shared,
        events_port: raw.kv_events_port.filter(|&p| p > 0),
        replay_port: raw.kv_replay_port.filter(|&p| p > 0),
        silence: Duration::from_millis(silence),
    }))
}

pub fn warmup(at: &str, raw: Option<&RawWarmup>) -> Result<Option<WarmupConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let prefixes = raw.prefixes.unwrap_or(8);
    if prefixes > 1024 {
        return Err(ConfigError::new(
            format!("{at}.warmup.prefixes"),
            format!("{prefixes} must be at most 1024"),
        ));
    }
    let timeout = raw.timeout_ms.unwrap_or(DEFAULT_WARMUP_TIMEOUT_MS);
    if !(100..=600_000).contains(&timeout) {
        return Err(ConfigError::new(
            format!("{at}.warmup.timeout_ms"),
            format!("{timeout} must be between 100 and 600000"),
        ));
    }
    Ok((prefixes > 0).then(|| WarmupConfig {
        prefixes: usize::try_from(prefixes).unwrap_or(8),
        timeout: Duration::from_millis(timeout),
    }))
}

/// An instance's event sockets: its own, or its host joined to the endpoint's ports.
pub fn instance_sockets(
    at: &str,
    ic: &mut InstanceConfig,
    kv_events: Option<&str>,
    kv_replay: Option<&str>,
    kv: Option<&KvAwareConfig>,
) -> Result<(), ConfigError> {
    let Some(kv) = kv else {
        if kv_events.is_some() || kv_replay.is_some() {
            return Err(ConfigError::new(
                format!("{at}.kv_events"),
                "only the kv_aware strategy subscribes to KV events",
            ));
        }
        return Ok(());
    };
    let host = reqwest::Url::parse(&ic.url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_default();
    let joined = |port: Option<u16>| port.map(|p| format!("tcp://{host}:{p}"));
    ic.kv_events = match kv_events {
        Some(u) => Some(zmq_endpoint(&format!("{at}.kv_events"), u)?),
        None => joined(kv.events_port),
    };
    ic.kv_replay = match kv_replay {
        Some(u) => Some(zmq_endpoint(&format!("{at}.kv_replay"), u)?),
        None => joined(kv.replay_port),
    };
    Ok(())
}

#[cfg(test)]
#[path = "kv_aware_tests.rs"]
mod tests;
