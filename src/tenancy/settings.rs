//! The `auth`, `tenants` and `isolation` sections, and `endpoints[].upstream_api_key`:
//! raw serde structs and their validation into [`TenancyConfig`]. Tenancy owns
//! its section of the config: `config` calls in here, never the other way.
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use axum::http::HeaderValue;
use serde::Deserialize;

use super::api_key::ApiKeys;
use super::is_valid_tenant_id;
use super::jwt::JwtVerifier;
use crate::error::ConfigError;
use crate::tenancy::sigv4::Sigv4Verifier;

/// A configured secret, kept out of `Debug` output and so out of logs.
///
/// In YAML it is either the value itself or where to find it, read when the
/// config is loaded (and so again on every reload):
/// `{ env: KVGATE_JWT_SECRET }` (an environment variable) or
/// `{ file: /var/run/secrets/kvgate/jwt }` (a file, such as a mounted
/// Kubernetes Secret; one trailing newline is dropped).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SecretSource")]
pub struct Secret(String);

/// Where a [`Secret`] comes from, as written in the config.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a secret: a string, { env: NAME } or { file: PATH }"
)]
enum SecretSource {
    Inline(String),
    From(SecretRef),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
enum SecretRef {
    Env(String),
    File(std::path::PathBuf),
}

impl TryFrom<SecretSource> for Secret {
    type Error = String;

    fn try_from(source: SecretSource) -> Result<Self, String> {
        let value = match source {
            SecretSource::Inline(s) => return Ok(Secret(s)),
            SecretSource::From(SecretRef::Env(name)) => std::env::var(&name).map_err(|_| {
                format!("secret from environment variable {name}: not set (or not UTF-8)")
            })?,
            SecretSource::From(SecretRef::File(path)) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("secret from file {}: {e}", path.display()))?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                text.strip_suffix('\r').unwrap_or(text).to_owned()
            }
        };
        if value.is_empty() {
            return Err("secret from the environment or a file is empty".to_owned());
        }
        Ok(Secret(value))
    }
}

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

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

/// Validated tenancy settings.
#[derive(Debug, Clone)]
pub struct TenancyConfig {
    /// The bearer scheme (`Authorization: Bearer …`), if one is on.
    pub auth: AuthConfig,
    /// SigV4-signed requests, if on (alone or beside a bearer scheme).
    pub sigv4: Option<Arc<Sigv4Verifier>>,
    pub tenants: TenantsConfig,
    /// Key of the upstream cache salt; `Some` means salting is on.
    pub salt_secret: Option<Secret>,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        Self {
            auth: AuthConfig::None,
            sigv4: None,
            tenants: TenantsConfig::default(),
            salt_secret: None,
        }
    }
}

#[derive(Debug, Clone)]
pub enum AuthConfig {
    /// Everyone is the anonymous tenant.
    None,
    ApiKeys(Arc<ApiKeys>),
    Jwt(Arc<JwtVerifier>),
}

/// One tenant's limits; `None` is unlimited (or, for `models`, all models).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_concurrency: Option<u32>,
    pub requests_per_minute: Option<NonZeroU32>,
    pub tokens_per_minute: Option<NonZeroU64>,
    pub models: Option<Arc<HashSet<String>>>,
    /// Its priority class in the queue, and the ceiling of what it may ask for.
    pub priority: super::priority::Priority,
    /// Its fair share's weight (positive; 1 by default).
    pub weight: f64,
    pub priority_header: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrency: None,
            requests_per_minute: None,
            tokens_per_minute: None,
            models: None,
            priority: super::priority::Priority::default(),
            weight: 1.0,
            priority_header: false,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct TenantsConfig {
    pub default: Limits,
    /// Each override already has the default's values where it sets none.
    pub overrides: HashMap<String, Limits>,
}

impl TenantsConfig {
    pub fn limits(&self, tenant: &str) -> &Limits {
        self.overrides.get(tenant).unwrap_or(&self.default)
    }
}

/// Validate the sections; `served` are the models the endpoints serve.
pub(crate) fn validate(
    auth: RawAuth,
    tenants: RawTenants,
    isolation: RawIsolation,
    served: &HashSet<&str>,
) -> Result<TenancyConfig, ConfigError> {
    let (bearer_auth, sigv4) = super::auth_mode::validate(auth)?;
    let auth = bearer_auth;
    let default_raw = tenants.default.unwrap_or_default();
    let default = limits("tenants.default", &default_raw, served)?;
    let mut overrides = HashMap::with_capacity(tenants.overrides.len());
    for (id, raw) in tenants.overrides {
        let at = format!("tenants.overrides.{id}");
        if !is_valid_tenant_id(&id) {
            return Err(ConfigError::new(
                at,
                "tenant ids are 1-128 visible ASCII characters",
            ));
        }
        // Unset fields inherit the default.
        let merged = RawLimits {
            max_concurrency: raw.max_concurrency.or(default_raw.max_concurrency),
            requests_per_minute: raw.requests_per_minute.or(default_raw.requests_per_minute),
            tokens_per_minute: raw.tokens_per_minute.or(default_raw.tokens_per_minute),
            models: raw.models.or_else(|| default_raw.models.clone()),
            priority: raw.priority.or_else(|| default_raw.priority.clone()),
            weight: raw.weight.or(default_raw.weight),
            priority_header: raw.priority_header.or(default_raw.priority_header),
        };
        overrides.insert(id, limits(&at, &merged, served)?);
    }
    let salt_on = isolation
        .upstream_cache_salt
        .unwrap_or(!matches!(auth, AuthConfig::None) || sigv4.is_some());
    let salt_secret = match (salt_on, isolation.salt_secret) {
        (false, _) => None,
        (true, None) => {
            return Err(ConfigError::new(
                "isolation.salt_secret",
                "required while upstream_cache_salt is on (the default with auth): set a random secret of 16+ bytes, or upstream_cache_salt: false",
            ));
        }
        (true, Some(s)) if s.expose().len() < 16 => {
            return Err(ConfigError::new(
                "isolation.salt_secret",
                "must be at least 16 bytes",
            ));
        }
        (true, Some(s)) => Some(s),
    };
    Ok(TenancyConfig {
        auth,
        sigv4,
        tenants: TenantsConfig { default, overrides },
        salt_secret,
    })
}

fn limits(at: &str, raw: &RawLimits, served: &HashSet<&str>) -> Result<Limits, ConfigError> {
    let positive = |name: &str, v: Option<u64>, max: u64| -> Result<Option<u64>, ConfigError> {
        match v {
            Some(n) if n == 0 || n > max => Err(ConfigError::new(
                format!("{at}.{name}"),
                format!("{n} is outside 1..={max} (leave it out for no limit)"),
            )),
            v => Ok(v),
        }
    };
    let conc = positive("max_concurrency", raw.max_concurrency, 1_000_000)?;
    let rpm = positive(
        "requests_per_minute",
        raw.requests_per_minute,
        u64::from(u32::MAX),
    )?;
    let tpm = positive(
        "tokens_per_minute",
        raw.tokens_per_minute,
        1_000_000_000_000,
    )?;
    let models = match &raw.models {
        None => None,
        Some(m) if m.is_empty() => {
            return Err(ConfigError::new(
                format!("{at}.models"),
                "an empty list allows nothing; leave it out to allow all",
            ));
        }
        Some(m) => {
            if let Some(unknown) = m.iter().find(|m| !served.contains(m.as_str())) {
                return Err(ConfigError::new(
                    format!("{at}.models"),
                    format!("{unknown:?} is not served by any endpoint"),
                ));
            }
            Some(Arc::new(m.iter().cloned().collect()))
        }
    };
    let priority = match &raw.priority {
        None => super::priority::Priority::default(),
        Some(name) => super::priority::Priority::parse(name).ok_or_else(|| {
            ConfigError::new(
                format!("{at}.priority"),
                format!("{name:?} is not a priority: high, normal or low"),
            )
        })?,
    };
    let weight = match raw.weight {
        None => 1.0,
        Some(w) if w.is_finite() && w > 0.0 && w <= 1e6 => w,
        Some(w) => {
            return Err(ConfigError::new(
                format!("{at}.weight"),
                format!("{w} is not a weight: a number above 0, at most 1000000"),
            ));
        }
    };
    Ok(Limits {
        priority,
        weight,
        priority_header: raw.priority_header.unwrap_or(false),
        max_concurrency: conc.and_then(|n| u32::try_from(n).ok()),
        requests_per_minute: rpm
            .and_then(|n| u32::try_from(n).ok())
            .and_then(NonZeroU32::new),
        tokens_per_minute: tpm.and_then(NonZeroU64::new),
        models,
    })
}

/// `endpoints[].upstream_api_key` as the `Authorization` header kvgate sends
/// upstream, marked sensitive so it is never logged.
pub(crate) fn upstream_authorization(
    at: &str,
    key: Option<Secret>,
) -> Result<Option<HeaderValue>, ConfigError> {
    let Some(key) = key else { return Ok(None) };
    let mut v = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
        .map_err(|_| ConfigError::new(at, "must be printable ASCII"))?;
    v.set_sensitive(true);
    Ok(Some(v))
}
