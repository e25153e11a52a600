//! `auth.mode` — one mode or a list (`[jwt, sigv4]`) — validated with the
//! sections it needs into [`AuthConfig`] and the SigV4 verifier: at most one
//! bearer scheme (`api_key` or `jwt`), SigV4 beside it or alone, `none` only
//! alone. [`super::settings`] validates the rest of the tenancy sections.

use std::collections::HashSet;
use std::sync::Arc;

use super::api_key::ApiKeys;
use super::is_valid_tenant_id;
use super::jwt::JwtVerifier;
use super::raw::{RawAuth, RawModes, RawSigv4};
use crate::error::ConfigError;
use crate::tenancy::sigv4::{Credential, Sigv4Verifier};

/// How a bearer credential (`Authorization: Bearer …`) names its tenant.
#[derive(Debug, Clone)]
pub enum AuthConfig {
    /// Everyone is the anonymous tenant.
    None,
    ApiKeys(Arc<ApiKeys>),
    Jwt(Arc<JwtVerifier>),
}

/// `auth.mode` (one mode or a list) and the sections it needs.
pub(super) fn validate(
    auth: RawAuth,
) -> Result<(AuthConfig, Option<Arc<Sigv4Verifier>>), ConfigError> {
    let modes = match auth.mode {
        None => vec!["none".to_owned()],
        Some(RawModes::One(m)) => vec![m],
        Some(RawModes::Many(m)) if m.is_empty() => {
            return Err(ConfigError::new(
                "auth.mode",
                "an empty list: name at least one mode",
            ));
        }
        Some(RawModes::Many(m)) => m,
    };
    let mut bearer = AuthConfig::None;
    let mut sigv4 = None;
    let mut seen = HashSet::new();
    if let Some(twice) = modes.iter().find(|m| !seen.insert(m.as_str())) {
        return Err(ConfigError::new(
            "auth.mode",
            format!("{twice:?} is listed twice"),
        ));
    }
    if seen.contains("api_key") && seen.contains("jwt") {
        return Err(ConfigError::new(
            "auth.mode",
            "api_key and jwt both use Authorization: Bearer; choose one",
        ));
    }
    for mode in &modes {
        match mode.as_str() {
            "none" if modes.len() == 1 => {}
            "none" => {
                return Err(ConfigError::new(
                    "auth.mode",
                    "none cannot be combined with other modes",
                ));
            }
            "api_key" => {
                bearer = AuthConfig::ApiKeys(Arc::new(ApiKeys::from_raw(
                    &auth.api_keys,
                    "auth.api_keys",
                )?));
            }
            "jwt" => {
                let raw = auth
                    .jwt
                    .as_ref()
                    .ok_or_else(|| ConfigError::new("auth.jwt", "required when mode is jwt"))?;
                bearer = AuthConfig::Jwt(Arc::new(JwtVerifier::from_raw(raw, "auth.jwt")?));
            }
            "sigv4" => {
                let raw = auth
                    .sigv4
                    .as_ref()
                    .ok_or_else(|| ConfigError::new("auth.sigv4", "required when mode is sigv4"))?;
                sigv4 = Some(Arc::new(sigv4_verifier(raw)?));
            }
            other => {
                return Err(ConfigError::new(
                    "auth.mode",
                    format!("{other:?} is not one of none, api_key, jwt, sigv4"),
                ));
            }
        }
    }
    let configured = auth.jwt.is_some() || !auth.api_keys.is_empty() || auth.sigv4.is_some();
    if seen.contains("none") && configured {
        return Err(ConfigError::new(
            "auth.mode",
            "is none, but keys are configured: set mode to jwt, api_key or sigv4, or remove them",
        ));
    }
    // A section the mode does not use is still checked, so a mistake shows
    // before the mode is switched to it.
    if let (None, Some(raw)) = (&sigv4, &auth.sigv4) {
        sigv4_verifier(raw)?;
    }
    Ok((bearer, sigv4))
}

fn sigv4_verifier(raw: &RawSigv4) -> Result<Sigv4Verifier, ConfigError> {
    let at = "auth.sigv4";
    let region = raw
        .region
        .clone()
        .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .ok_or_else(|| {
            ConfigError::new(
                format!("{at}.region"),
                "required: the region clients sign for, e.g. us-east-1",
            )
        })?;
    if raw.credentials.is_empty() {
        return Err(ConfigError::new(
            format!("{at}.credentials"),
            "mode sigv4 needs at least one credential",
        ));
    }
    let mut keys = HashSet::new();
    let mut credentials = Vec::with_capacity(raw.credentials.len());
    for (i, c) in raw.credentials.iter().enumerate() {
        let here = |f: &str| format!("{at}.credentials[{i}].{f}");
        if !is_valid_tenant_id(&c.tenant) {
            return Err(ConfigError::new(
                here("tenant"),
                "tenant ids are 1-128 visible ASCII characters",
            ));
        }
        let id_ok = (1..=128).contains(&c.access_key_id.len())
            && c.access_key_id.bytes().all(|b| b.is_ascii_alphanumeric());
        if !id_ok {
            return Err(ConfigError::new(
                here("access_key_id"),
                "1-128 letters and digits, e.g. AKIA…",
            ));
        }
        if !keys.insert(c.access_key_id.as_str()) {
            return Err(ConfigError::new(
                here("access_key_id"),
                "the same key id is listed twice",
            ));
        }
        if c.secret_access_key.expose().len() < 16 {
            return Err(ConfigError::new(
                here("secret_access_key"),
                "must be at least 16 bytes",
            ));
        }
        credentials.push(Credential {
            tenant: Arc::from(c.tenant.as_str()),
            access_key_id: c.access_key_id.clone(),
            secret_access_key: c.secret_access_key.expose().to_owned(),
        });
    }
    let max = match raw.max_unverified_uploads {
        None => 64,
        Some(n @ 1..=100_000) => n,
        Some(n) => {
            return Err(ConfigError::new(
                format!("{at}.max_unverified_uploads"),
                format!("{n} is outside 1..=100000"),
            ));
        }
    };
    Ok(Sigv4Verifier::new(
        region,
        credentials,
        usize::try_from(max).unwrap_or(64),
    ))
}
