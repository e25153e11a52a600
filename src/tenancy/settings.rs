//! The `auth`, `tenants` and `isolation` sections, and `endpoints[].upstream_api_key`:
//! their raw serde structs ([`super::raw`]) validated into [`TenancyConfig`].
//! Tenancy owns its section of the config: `config` calls in here, never the
//! other way.

use std::collections::{HashMap, HashSet};
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use axum::http::HeaderValue;

use super::is_valid_tenant_id;
use super::priority::Priority;
use super::raw::{RawAuth, RawIsolation, RawLimits, RawTenants};
use crate::error::ConfigError;
use crate::tenancy::sigv4::Sigv4Verifier;

// Named here by `config`, `openai` and the rest of tenancy.
pub use super::auth_mode::AuthConfig;
pub use super::secret::Secret;

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

/// One tenant's limits; `None` is unlimited (or, for `models`, all models).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_concurrency: Option<u32>,
    pub requests_per_minute: Option<NonZeroU32>,
    pub tokens_per_minute: Option<NonZeroU64>,
    pub models: Option<Arc<HashSet<String>>>,
    /// Its priority class in the queue, and the ceiling of what it may ask for.
    pub priority: Priority,
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
            priority: Priority::default(),
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
        None => Priority::default(),
        Some(name) => Priority::parse(name).ok_or_else(|| {
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
