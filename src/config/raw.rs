//! The YAML file as written: serde structs that refuse unknown keys.
//!
//! Nothing here is validated beyond types; `validate.rs` turns these into the
//! runtime [`crate::config::Config`] and names the field of every error.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    pub endpoints: Vec<RawEndpoint>,
    #[serde(default)]
    pub auth: crate::tenancy::raw::RawAuth,
    #[serde(default)]
    pub tenants: crate::tenancy::raw::RawTenants,
    #[serde(default)]
    pub isolation: crate::tenancy::raw::RawIsolation,
    #[serde(default)]
    pub admin: crate::tenancy::admin::RawAdmin,
    #[serde(default)]
    pub upstream: crate::config::tls::RawUpstream,
    /// Tenant limits shared by several replicas (`cluster.redis`).
    pub cluster: Option<crate::tenancy::cluster::RawCluster>,
    /// Fair queueing when the fleet is saturated.
    pub queue: Option<super::queue::RawQueue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    pub max_body_bytes: Option<u64>,
    pub timeouts: Option<RawTimeouts>,
    pub failover_cooldown_ms: Option<u64>,
    pub shutdown_grace_ms: Option<u64>,
    pub sse_keepalive_ms: Option<u64>,
    pub max_connections: Option<u64>,
    pub http2_keepalive_ms: Option<u64>,
    pub access_log: Option<bool>,
    pub workers: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTimeouts {
    pub connect_ms: Option<u64>,
    pub first_byte_ms: Option<u64>,
    pub idle_ms: Option<u64>,
    pub header_read_ms: Option<u64>,
    pub body_read_ms: Option<u64>,
    pub client_idle_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEndpoint {
    pub name: String,
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub instances: Vec<RawInstance>,
    pub discovery: Option<RawDiscovery>,
    #[serde(default)]
    pub routing: RawRouting,
    pub health: Option<RawHealth>,
    /// Sent upstream as `Authorization: Bearer …` (e.g. vLLM's `--api-key`).
    pub upstream_api_key: Option<crate::tenancy::secret::Secret>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub path: Option<String>,
    pub interval_ms: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub healthy_threshold: Option<u64>,
    pub unhealthy_threshold: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInstance {
    pub url: String,
    /// Stable id for the hash ring; defaults to the URL.
    pub id: Option<String>,
    /// This instance's KV capacity in tokens, over the endpoint's `cache_tokens`.
    pub cache_tokens: Option<u64>,
    /// Its vLLM KV-event publisher, e.g. `tcp://10.0.0.11:5557` (`kv_aware`).
    pub kv_events: Option<String>,
    /// Its replay socket, e.g. `tcp://10.0.0.11:5558`.
    pub kv_replay: Option<String>,
}

/// `endpoints[].discovery`, validated in `discovery.rs`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    /// `host:port`: every A/AAAA record of `host` is an instance on `port`.
    pub dns: Option<String>,
    /// A resolver to ask instead of the system's (`/etc/resolv.conf`).
    pub dns_server: Option<String>,
    pub interval_ms: Option<u64>,
    /// `http` (default) or `https`.
    pub scheme: Option<String>,
    /// A Service's EndpointSlices, watched.
    pub kubernetes: Option<RawKubernetes>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKubernetes {
    pub namespace: Option<String>,
    pub service: Option<String>,
    /// The engine's port: a number, or the name of one of the slice's ports.
    pub port: Option<RawPort>,
    /// The API server; default: in-cluster (service account), else kubeconfig.
    pub api_server: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawPort {
    Number(u16),
    Name(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    pub strategy: Option<String>,
    pub prefix_length: Option<u64>,
    pub concurrency_threshold: Option<u64>,
    pub balance_factor: Option<f64>,
    pub virtual_nodes: Option<u64>,
    pub prompt_members: Option<Vec<String>>,
    pub block_chars: Option<u64>,
    pub cache_tokens: Option<u64>,
    pub max_prompt_blocks: Option<u64>,
    /// `kv_aware`: vLLM's `--block-size`.
    pub block_size: Option<u64>,
    /// `kv_aware`: a tokenizer.json path or `tiktoken:<encoding>`.
    pub tokenizer: Option<String>,
    /// `kv_aware`: a Jinja chat template file, over the model folder's own
    /// (chat_template.jinja, else tokenizer_config.json's).
    pub chat_template: Option<String>,
    /// `kv_aware`: what a CPU-offloaded block counts for, against a GPU one.
    pub cpu_tier_weight: Option<f64>,
    /// `kv_aware`: a KV tier every instance reaches (LMCache server, Mooncake store).
    pub shared_tier: Option<RawSharedTier>,
    /// `kv_aware`: publisher port on each instance's host, for instances
    /// without `kv_events` (discovered ones).
    pub kv_events_port: Option<u16>,
    pub kv_replay_port: Option<u16>,
    /// `kv_aware`: how long a request may go unanswered by events before the
    /// instance falls back to the approximate index.
    pub kv_events_silence_ms: Option<u64>,
    /// `kv_aware`/`longest_prefix`: warm instances that join with the hottest prefixes.
    pub warmup: Option<RawWarmup>,
}

impl RawConfig {
    /// Make relative tokenizer and chat-template paths relative to `base`.
    pub fn resolve_paths(&mut self, base: &std::path::Path) {
        let fix = |p: &mut Option<String>| {
            if let Some(s) = p.as_mut()
                && !s.starts_with("tiktoken:")
                && std::path::Path::new(s.as_str()).is_relative()
            {
                *s = base.join(&*s).display().to_string();
            }
        };
        if let Some(tls) = self.upstream.tls.as_mut() {
            fix(&mut tls.ca_file);
        }
        for ep in &mut self.endpoints {
            fix(&mut ep.routing.tokenizer);
            fix(&mut ep.routing.chat_template);
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSharedTier {
    pub kv_events: String,
    pub kv_replay: Option<String>,
    pub weight: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWarmup {
    /// Hottest prefixes sent to a joining instance (0 turns warm-up off).
    pub prefixes: Option<u64>,
    /// Longest the warm-up may take before the instance takes traffic anyway.
    pub timeout_ms: Option<u64>,
}
