//! Configuration: the YAML file ([`raw`]), its validation into runtime types
//! ([`validate`]), and loading from disk.

pub mod discovery;
pub mod kv_aware;
pub mod queue;
mod raw;
pub mod tls;
mod validate;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kvgate_routing::Strategy;

pub use crate::tenancy::settings::{AuthConfig, Limits, Secret, TenancyConfig, TenantsConfig};
pub use validate::{
    ConfigError, DEFAULT_CACHE_AWARE_BALANCE_FACTOR, DEFAULT_CACHE_AWARE_THRESHOLD,
    DEFAULT_MAX_PROMPT_BLOCKS, DEFAULT_PREFIX_LENGTH,
};

/// A validated configuration. Every value has been range-checked; every
/// default has been filled in.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub endpoints: Vec<EndpointConfig>,
    /// `auth`, `tenants` and `isolation`.
    pub tenancy: TenancyConfig,
    /// `admin.token`; `None` turns the `/admin/*` routes off.
    pub admin: Option<crate::tenancy::admin::AdminToken>,
    /// `upstream.tls`: the roots the upstream client trusts for `https://` instances.
    pub upstream_tls: crate::config::tls::UpstreamTls,
    /// `cluster`: limits shared through Redis, when set.
    pub cluster: Option<crate::tenancy::cluster::ClusterConfig>,
    /// `queue`: fair queueing when the fleet is saturated.
    pub queue: queue::QueueConfig,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    pub timeouts: Timeouts,
    /// How long an instance that refused a connection is skipped.
    pub failover_cooldown: Duration,
    /// How long SIGTERM waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// Send an SSE comment (`: ping`) after this much silence on a stream,
    /// so idle timeouts of load balancers in front don't cut long prefills.
    pub sse_keepalive: Option<Duration>,
    /// Most client connections open at once; the accept loop waits (the
    /// kernel's backlog holds new ones) until one closes.
    pub max_connections: usize,
    /// HTTP/2 PING interval, and how long an answer may take; `None` = off.
    pub http2_keepalive: Option<Duration>,
    /// One `routed` line per forwarded request at INFO (target
    /// `kvgate::access`): off by default, since metrics count every request
    /// and a line per request costs more than the routing decision.
    pub access_log: bool,
    /// Threads serving client connections, each a one-thread runtime with
    /// its own upstream pool (`server/cores.rs`); default: one a CPU.
    pub workers: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    /// From sending the request to the upstream's response headers.
    pub first_byte: Duration,
    /// Longest silence allowed between two chunks of a response body.
    pub idle: Duration,
    /// Longest a client may take to send a request's headers (slowloris).
    pub header_read: Duration,
    /// Longest a client may take to send a request's whole body (slow uploads).
    pub body_read: Duration,
    /// Longest a client connection may sit with no request in flight or arriving.
    pub client_idle: Duration,
}

#[derive(Debug, Clone)]
pub struct EndpointConfig {
    pub name: String,
    pub models: Vec<String>,
    pub instances: Vec<InstanceConfig>,
    pub routing: RoutingConfig,
    /// Active health checks; `None` means passive ejection only.
    pub health: Option<HealthConfig>,
    /// `Authorization` sent upstream (from `upstream_api_key`), in place of
    /// the client's, which never leaves the gateway.
    pub upstream_authorization: Option<axum::http::HeaderValue>,
    /// Where more instances are found (DNS, EndpointSlices), beside the static list.
    pub discovery: Option<discovery::DiscoveryConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// `/health` (vLLM) or `/ping` (SageMaker containers).
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive successes that bring an unhealthy instance back.
    pub healthy_threshold: u32,
    /// Consecutive failures that take a healthy instance out.
    pub unhealthy_threshold: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceConfig {
    /// Stable identity on the hash ring (the URL unless set).
    pub id: String,
    /// Base URL without a trailing slash, e.g. `http://10.0.0.11:8000`.
    pub url: String,
    /// KV capacity assumed for this instance, tokens (cache-aware strategies).
    pub cache_tokens: usize,
    /// Neither the instance nor its endpoint sets `cache_tokens`: learn it from
    /// the engine's `vllm:cache_config_info` (see `fleet::capacity`).
    pub learn_cache_tokens: bool,
    /// Its KV-event publisher and replay socket (`kv_aware`).
    pub kv_events: Option<String>,
    pub kv_replay: Option<String>,
    /// Found by `discovery` rather than written in the config.
    pub discovered: bool,
}

#[derive(Debug, Clone)]
pub struct RoutingConfig {
    pub strategy: Strategy,
    /// The spelling the file used (`PREFIX_AWARE`, `prefixaware`, …), if any.
    pub strategy_as_written: Option<String>,
    pub prefix_length: usize,
    pub concurrency_threshold: usize,
    pub balance_factor: Option<f64>,
    pub virtual_nodes: usize,
    pub prompt_members: Vec<String>,
    /// Characters of canonical prompt per index block (cache-aware strategies).
    pub block_chars: usize,
    /// KV capacity assumed per instance, tokens, unless an instance says otherwise.
    pub cache_tokens: usize,
    /// `cache_tokens` was written in the file (not the default).
    pub cache_tokens_configured: bool,
    /// Most blocks one prompt contributes to the index.
    pub max_prompt_blocks: usize,
    /// The `kv_aware` settings (that strategy only).
    pub kv: Option<kv_aware::KvAwareConfig>,
    /// Warming instances that join (cache-aware strategies).
    pub warmup: Option<kv_aware::WarmupConfig>,
}

impl RoutingConfig {
    /// How far into a prompt the canonicaliser must look: the window for the
    /// key, and for cache-aware strategies the whole indexed chain.
    pub fn scan_chars(&self) -> usize {
        if self.strategy.uses_index() {
            self.prefix_length
                .max(self.block_chars.saturating_mul(self.max_prompt_blocks))
        } else {
            self.prefix_length
        }
    }

    /// Index capacity, in blocks, of an instance holding `cache_tokens`,
    /// each block standing for `block_tokens` of the engine's tokens (the
    /// endpoint's tokens a character × `block_chars`: learned, or the guess).
    pub fn index_blocks(&self, cache_tokens: usize, block_tokens: u64) -> usize {
        if !self.strategy.uses_index() {
            return 0;
        }
        (cache_tokens / usize::try_from(block_tokens.max(1)).unwrap_or(usize::MAX)).max(1)
    }
}

/// The placeholder secrets `config.example.yaml` ships with: a config that
/// still has one would let anyone who read the example forge tokens or
/// recompute tenants' cache salts.
pub const EXAMPLE_SECRETS: [&str; 4] = [
    "change-me-to-32-random-bytes-or-more",
    "change-me-too-32-random-bytes-or-more",
    "change-me-admin-token-32-random-bytes",
    "change-me-aws-secret-access-key-40-chars",
];

/// The example's placeholder secrets that appear in a config's text.
pub fn placeholder_secrets(text: &str) -> Vec<&'static str> {
    EXAMPLE_SECRETS
        .iter()
        .copied()
        .filter(|p| text.contains(p))
        .collect()
}

impl Config {
    /// Secret settings `check` warns about: placeholders from the example
    /// (which `serve` refuses, see [`placeholder_secrets`]) and salt secrets
    /// shorter than 32 bytes. HS256 secrets are already refused below 32.
    pub fn secret_warnings(&self, text: &str) -> Vec<String> {
        let mut out: Vec<String> = placeholder_secrets(text)
            .iter()
            .map(|p| format!("{p:?} is config.example.yaml's placeholder: kvgate serve refuses it"))
            .collect();
        if self
            .tenancy
            .salt_secret
            .as_ref()
            .is_some_and(|s| s.expose().len() < 32)
        {
            out.push("isolation.salt_secret is shorter than 32 bytes".to_owned());
        }
        out
    }

    /// Parse and validate YAML text; relative file paths in it (tokenizers,
    /// chat templates) are taken from the working directory.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        Self::from_yaml_in(text, None)
    }

    fn from_yaml_in(text: &str, base: Option<&Path>) -> Result<Self, ConfigError> {
        let mut raw: raw::RawConfig =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::new("(file)", e.to_string()))?;
        if let Some(base) = base {
            raw.resolve_paths(base);
        }
        validate::validate(raw)
    }

    /// Read, parse and validate a file. Relative paths in it are relative to
    /// the file's own directory, so `kvgate check` and `kvgate serve` agree
    /// wherever they are run from.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("(file)", format!("{}: {e}", path.display())))?;
        Self::from_yaml_in(&text, path.parent())
    }
}
