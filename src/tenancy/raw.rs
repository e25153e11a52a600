//! The `auth`, `tenants` and `isolation` sections as written: serde structs
//! that refuse unknown keys, checked for nothing beyond their types.
//! `settings.rs` (with `auth_mode.rs`, `api_key.rs` and `jwt.rs`) validates them.
//!
//! ```yaml
//! auth:
//!   mode: jwt                  # none (default) | api_key | jwt | sigv4, or a list: [jwt, sigv4]
//!   jwt: { algorithms: [RS256], jwks_file: /etc/kvgate/jwks.json,
//!          issuer: https://auth.example.com, audience: kvgate, tenant_claim: tenant }
//!   api_keys: [{ tenant: acme, sha256: <64 hex digits> }]
//!   sigv4: { region: us-east-1, max_unverified_uploads: 64,
//!            credentials: [{ tenant: acme, access_key_id: AKIA…, secret_access_key: … }] }
//! tenants:
//!   default:   { max_concurrency: 64, requests_per_minute: 600, tokens_per_minute: 200000 }
//!   overrides: { acme: { max_concurrency: 2, models: [meta-llama/Llama-3.1-8B-Instruct] } }
//! isolation: { upstream_cache_salt: true, salt_secret: <random, 16+ bytes> }
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use super::secret::Secret;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub mode: Option<RawModes>,
    pub jwt: Option<RawJwt>,
    #[serde(default)]
    pub api_keys: Vec<RawApiKey>,
    pub sigv4: Option<RawSigv4>,
}

/// `mode: jwt` or `mode: [jwt, sigv4]`: a request may use any listed mode.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawModes {
    One(String),
    Many(Vec<String>),
}

/// `auth.sigv4`: AWS SigV4-signed callers (boto3's `sagemaker-runtime`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSigv4 {
    pub region: Option<String>,
    #[serde(default)]
    pub credentials: Vec<RawSigv4Credential>,
    /// Signed uploads whose body is still being read (and so not yet
    /// verified), all tenants together; default 64.
    pub max_unverified_uploads: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSigv4Credential {
    pub tenant: String,
    pub access_key_id: String,
    pub secret_access_key: Secret,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    #[serde(default)]
    pub algorithms: Vec<String>,
    pub secret: Option<Secret>,
    pub public_key_pem: Option<String>,
    pub public_key_file: Option<String>,
    pub jwks_file: Option<String>,
    /// An OIDC provider's `jwks_uri`, fetched and refreshed.
    pub jwks_url: Option<String>,
    /// Seconds between refetches of `jwks_url`; default 300.
    pub jwks_refresh_s: Option<u64>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub tenant_claim: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`; default 30, at most 300.
    pub leeway_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKey {
    pub tenant: String,
    /// `printf %s "$KEY" | sha256sum`: 64 hex digits.
    pub sha256: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenants {
    pub default: Option<RawLimits>,
    #[serde(default)]
    pub overrides: BTreeMap<String, RawLimits>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_concurrency: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub models: Option<Vec<String>>,
    /// Priority class when the queue orders waiting requests (`high`,
    /// `normal`, `low`); also the most `queue.priority_header` may ask for.
    pub priority: Option<String>,
    /// Share of the fleet under contention, relative to other tenants' (VTC).
    pub weight: Option<f64>,
    /// Whether requests may set their priority with `queue.priority_header`.
    pub priority_header: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIsolation {
    /// Default: on whenever `auth.mode` is not `none`.
    pub upstream_cache_salt: Option<bool>,
    pub salt_secret: Option<Secret>,
}
