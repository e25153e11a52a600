//! Tenants: who is calling, what they may use, and how they are kept apart.
//!
//! Authentication ([`jwt`], [`api_key`], SigV4 in [`crate::tenancy::sigv4`])
//! produces a [`Tenant`]; its id salts every routing key (so tenants never
//! share placement) and, with `isolation.upstream_cache_salt`, the upstream's
//! `cache_salt` ([`salt`]).
//! [`quota`] admits or refuses each request against the tenant's limits.
//! Everything here is built from config into one [`Tenancy`] that lives in the
//! [`crate::Runtime`], so a reload swaps keys, limits and salts together.

pub mod admin;
pub mod api_key;
mod auth_mode;
mod bucket;
pub mod cluster;
pub mod jwks_url;
pub mod jwt;
pub mod priority;
pub mod quota;
pub mod raw;
pub mod salt;
pub mod secret;
pub mod settings;
pub mod sigv4;

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, header};
use kvgate_prefix::Api;

use bytes::Bytes;
use settings::{AuthConfig, TenancyConfig};

use crate::error::{ApiError, ErrorKind};

pub use quota::{Admission, Registry};

/// The authenticated caller. With authentication off, everyone is [`Tenant::anonymous`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: Arc<str>,
}

impl Tenant {
    pub fn anonymous() -> Self {
        Self {
            id: Arc::from("anonymous"),
        }
    }
}

/// Longest tenant id accepted from a token or from config.
pub const MAX_TENANT_ID_LEN: usize = 128;

/// 1–128 visible ASCII characters. Ids end up in logs, metric labels and
/// hash inputs; a narrow alphabet keeps all three unambiguous.
pub fn is_valid_tenant_id(id: &str) -> bool {
    (1..=MAX_TENANT_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Longest bearer credential looked at; anything longer is refused unread.
const MAX_CREDENTIAL_LEN: usize = 16 * 1024;

/// Everything tenancy needs at request time, derived from one config.
#[derive(Debug)]
pub struct Tenancy {
    config: TenancyConfig,
    registry: Registry,
    /// Shared limits (`cluster.redis`), when configured.
    cluster: Option<Arc<crate::tenancy::cluster::Cluster>>,
}

impl Tenancy {
    /// Build from config, carrying per-tenant counters over from `previous`
    /// so a reload neither forgets requests in flight nor refills quotas.
    /// With a `cluster`, limits are shared by every replica using it.
    pub fn build(
        config: &TenancyConfig,
        previous: Option<&Tenancy>,
        cluster: Option<Arc<crate::tenancy::cluster::Cluster>>,
    ) -> Self {
        if let AuthConfig::Jwt(jwt) = &config.auth {
            jwt.start();
        }
        Self {
            registry: Registry::build(config, previous.map(|p| &p.registry)),
            config: config.clone(),
            cluster,
        }
    }

    /// The shared-limits handle, for a reload to carry over.
    pub fn cluster(&self) -> Option<&Arc<crate::tenancy::cluster::Cluster>> {
        self.cluster.as_ref()
    }

    /// Who is calling, from `Authorization: Bearer …` or `x-api-key` (see
    /// [`credential`]); 401 if it doesn't say.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Tenant, ApiError> {
        if matches!(self.config.auth, AuthConfig::None) {
            if self.config.sigv4.is_some() {
                return Err(ApiError::new(
                    ErrorKind::MissingAuthenticationToken,
                    "Missing Authentication Token: sign the request with AWS SigV4",
                ));
            }
            return Ok(Tenant::anonymous());
        }
        let token = credential(headers)?;
        let id = match &self.config.auth {
            AuthConfig::None => return Ok(Tenant::anonymous()),
            AuthConfig::ApiKeys(keys) => keys
                .lookup(token)
                .ok_or_else(|| invalid_credentials("the API key is not valid"))?,
            AuthConfig::Jwt(jwt) => jwt.verify(token).map_err(|m| invalid_credentials(&m))?,
        };
        Ok(Tenant { id })
    }

    /// The SigV4 verifier, when this request is SigV4-signed and SigV4 is on.
    /// Such a caller is only a tenant once its body is read and verified.
    pub fn sigv4_for(
        &self,
        headers: &HeaderMap,
    ) -> Option<&Arc<crate::tenancy::sigv4::Sigv4Verifier>> {
        self.config
            .sigv4
            .as_ref()
            .filter(|_| crate::tenancy::sigv4::is_signed(headers))
    }

    /// Whether `tenant` may use `model` (its override's `models` list, if any).
    pub fn may_use(&self, tenant: &Tenant, model: &str) -> bool {
        self.config
            .tenants
            .limits(&tenant.id)
            .models
            .as_ref()
            .is_none_or(|m| m.contains(model))
    }

    /// Take `tenant`'s concurrency slot (429 if none is free), before the
    /// body is read; [`Self::admit`] then uses it.
    pub async fn hold(&self, tenant: &Tenant) -> Result<Held, ApiError> {
        let state = self.registry.get(&tenant.id, &self.config);
        let slot = state
            .take_slot(self.cluster.as_ref())
            .await
            .inspect_err(|e| state.live.refused(quota::refusal_of(e)))?;
        Ok(Held { slot, state })
    }

    /// Every tenant seen so far, with its limits and live figures (the console).
    pub fn tenants(&self) -> Vec<Arc<quota::TenantState>> {
        self.registry.all()
    }

    /// Count a refusal after admission (the fair queue's) against `tenant`.
    pub fn refused(&self, tenant: &Arc<str>, why: crate::telemetry::live::Refusal) {
        self.registry.get(tenant, &self.config).live.refused(why);
    }

    /// Apply the tenant's model allow-list (403) and quotas (429); on success
    /// salt the body for the upstream cache and issue the admission ticket
    /// that the response body releases, with the `x-ratelimit-*` headers.
    pub async fn admit(
        &self,
        tenant: &Tenant,
        ask: Ask<'_>,
        held: Option<Held>,
    ) -> Result<Admitted, ApiError> {
        let (state, slot) = match held {
            Some(Held { slot, state }) => (state, slot),
            None => (self.registry.get(&tenant.id, &self.config), None),
        };
        check_models(&state.limits, ask.api, ask.model, ask.endpoint_models)
            .inspect_err(|_| state.live.refused(crate::telemetry::live::Refusal::Model))?;
        // Every JSON object body gets the tenant's salt, native ones too: the
        // Invoke route must not be a way to share or probe another's cache.
        // A body that is not an object (a native one, an upload) has no
        // member to carry one.
        let body = match &state.salt {
            Some(s) if ask.is_object => Some(salt::apply(ask.body, s, ask.has_cache_salt)?),
            _ => None,
        };
        let estimate = quota::estimate_tokens(ask.body);
        let (admission, headers) = state
            .admit(estimate, self.cluster.as_ref(), slot)
            .await
            .inspect_err(|e| state.live.refused(quota::refusal_of(e)))?;
        state.live.admitted();
        Ok(Admitted {
            body,
            admission,
            headers,
        })
    }

    /// The model allow-list alone (403), as [`Tenancy::admit`] applies it:
    /// for `explain`, which must not show a tenant a route it may not take.
    pub fn check_models(
        &self,
        tenant: &str,
        api: Api,
        model: Option<&str>,
        endpoint_models: &[String],
    ) -> Result<(), ApiError> {
        check_models(
            self.config.tenants.limits(tenant),
            api,
            model,
            endpoint_models,
        )
    }

    /// The limits that apply to `tenant` (its override, else the default).
    pub fn limits(&self, tenant: &str) -> &settings::Limits {
        self.config.tenants.limits(tenant)
    }
}

fn check_models(
    limits: &settings::Limits,
    api: Api,
    model: Option<&str>,
    endpoint_models: &[String],
) -> Result<(), ApiError> {
    let Some(allowed) = &limits.models else {
        return Ok(());
    };
    let ok = match (api, model) {
        (Api::Chat | Api::Completions, Some(m)) => allowed.contains(m),
        // A native call reaches every model of its endpoint: allow it
        // only where all of them are allowed.
        _ => !endpoint_models.is_empty() && endpoint_models.iter().all(|m| allowed.contains(m)),
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorKind::Forbidden,
            "this tenant may not use the requested model",
        )
        .with_param("model"))
    }
}

/// A concurrency slot taken from the headers, held by the pipeline until
/// admission moves it into the [`Admission`]; dropped with the request if
/// it never gets there.
#[derive(Debug)]
pub struct Held {
    slot: Option<quota::Slot>,
    /// The tenant's counters, looked up once for both steps.
    state: Arc<quota::TenantState>,
}

/// What admission needs to know of a parsed request.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub api: Api,
    /// The body's `model` (OpenAI routes; optional on native ones).
    pub model: Option<&'a str>,
    /// Every model the request's endpoint serves (native calls reach them all).
    pub endpoint_models: &'a [String],
    pub body: &'a Bytes,
    /// The body has a top-level `cache_salt` of its own (to be replaced).
    pub has_cache_salt: bool,
    /// The body is a JSON object (always, on OpenAI routes).
    pub is_object: bool,
}

/// An admitted request.
#[derive(Debug)]
pub struct Admitted {
    /// The body to forward instead, when the upstream cache salt was set.
    pub body: Option<Bytes>,
    /// Held by the response body until it ends: the concurrency slot and the token charge.
    pub admission: Admission,
    pub headers: quota::RateHeaders,
}

/// Anthropic's SDKs send their key in this header instead of `Authorization`.
const API_KEY_HEADER: &str = "x-api-key";

/// A tenant's credential: `Authorization: Bearer …`, or `x-api-key: …` as
/// Anthropic's SDKs (and Claude Code) send it; the same tenants either way.
/// Both may be sent only when they carry the same credential: which one would
/// win is not something a caller should have to guess.
pub(crate) fn credential(headers: &HeaderMap) -> Result<&str, ApiError> {
    let key = api_key(headers)?;
    if !headers.contains_key(header::AUTHORIZATION) {
        return key.ok_or_else(missing_credentials);
    }
    let token = bearer(headers)?;
    match key {
        Some(k) if k != token => Err(invalid_credentials(
            "Authorization and x-api-key carry different credentials",
        )),
        _ => Ok(token),
    }
}

/// The value of a single `x-api-key` header, if sent.
fn api_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut all = headers.get_all(API_KEY_HEADER).iter();
    let Some(value) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(invalid_credentials("send exactly one x-api-key header"));
    }
    if value.len() > MAX_CREDENTIAL_LEN {
        return Err(invalid_credentials("the credential is too long"));
    }
    let key = value
        .to_str()
        .map_err(|_| invalid_credentials("the x-api-key header is not ASCII"))?
        .trim();
    if key.is_empty() || key.contains(' ') {
        return Err(invalid_credentials("x-api-key must hold one key"));
    }
    Ok(Some(key))
}

/// The token of a single `Authorization: Bearer …` header.
pub(crate) fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let mut all = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (all.next(), all.next()) else {
        return Err(if headers.contains_key(header::AUTHORIZATION) {
            invalid_credentials("send exactly one Authorization header")
        } else {
            missing_credentials()
        });
    };
    if value.len() > MAX_CREDENTIAL_LEN {
        return Err(invalid_credentials("the credential is too long"));
    }
    let text = value
        .to_str()
        .map_err(|_| invalid_credentials("the Authorization header is not ASCII"))?;
    let (scheme, token) = text.split_once(' ').unwrap_or((text, ""));
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.contains(' ') {
        return Err(invalid_credentials(
            "use the Authorization: Bearer <token> scheme",
        ));
    }
    Ok(token)
}

fn missing_credentials() -> ApiError {
    ApiError::new(
        ErrorKind::Unauthorized,
        "no credentials: send Authorization: Bearer <token> (or x-api-key: <token>)",
    )
    .with_header(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(r#"Bearer realm="kvgate""#),
    )
}

/// RFC 6750 §3: `error="invalid_token"` tells clients not to retry as is.
fn invalid_credentials(why: &str) -> ApiError {
    ApiError::new(
        ErrorKind::Unauthorized,
        format!("invalid credentials: {why}"),
    )
    .with_header(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(r#"Bearer realm="kvgate", error="invalid_token""#),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids() {
        assert!(is_valid_tenant_id("acme"));
        assert!(is_valid_tenant_id("org_1/team:a@b.c"));
        assert!(!is_valid_tenant_id(""));
        assert!(!is_valid_tenant_id("a b"));
        assert!(!is_valid_tenant_id("é"));
        assert!(!is_valid_tenant_id(&"a".repeat(129)));
    }

    fn h(v: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        m
    }

    #[test]
    fn x_api_key_is_a_credential_too() {
        let mut m = HeaderMap::new();
        m.insert(API_KEY_HEADER, HeaderValue::from_static("k1"));
        assert_eq!(credential(&m).unwrap(), "k1");
        m.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert_eq!(credential(&m).unwrap(), "k1");
        m.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k2"));
        assert!(credential(&m).is_err());
        m.remove(header::AUTHORIZATION);
        m.append(API_KEY_HEADER, HeaderValue::from_static("k1"));
        assert!(credential(&m).is_err());
        assert!(credential(&HeaderMap::new()).is_err());
        assert_eq!(credential(&h("Bearer abc")).unwrap(), "abc");
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(&h("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer(&h("bearer  abc ")).unwrap(), "abc");
        assert!(bearer(&h("Basic abc")).is_err());
        assert!(bearer(&h("Bearer")).is_err());
        assert!(bearer(&h("Bearer a b")).is_err());
        assert!(bearer(&HeaderMap::new()).is_err());
        let mut two = h("Bearer a");
        two.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        assert!(bearer(&two).is_err());
    }
}
