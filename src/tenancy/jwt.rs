//! JWT bearer tokens: signature, then `exp` (required), `nbf`, `iss` and
//! `aud` (both required and checked), then the tenant from one claim.
//!
//! The accepted algorithms must all be of one family, and the key material
//! must be of that family: HMAC with `secret`; RSA, EC or EdDSA with
//! `public_key_pem`, `public_key_file`, `jwks_file` or `jwks_url` (fetched
//! and refreshed: `jwks_url.rs`). A token whose header
//! names another algorithm is refused before its signature is looked at, so
//! neither `alg: none` nor the RSA-public-key-as-HMAC-secret confusion works.
//! Keys are loaded and parsed at config time: `kvgate check` catches them.

use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind as JwtError};
use serde_json::{Map, Value};

use super::is_valid_tenant_id;
use super::jwks_url::{RemoteJwks, key_set};
use super::raw::RawJwt;
use crate::error::ConfigError;

/// HMAC secrets shorter than the hash (RFC 7518 §3.2) are brute-forceable.
const MIN_SECRET_BYTES: usize = 32;

#[derive(Clone)]
enum Keys {
    One(DecodingKey),
    /// From a JWKS: chosen by the token's `kid`.
    Set(Vec<(Option<String>, DecodingKey)>),
    /// From a JWKS URL, refreshed (see `jwks_url`).
    Remote(Arc<RemoteJwks>),
}

#[derive(Clone)]
pub struct JwtVerifier {
    keys: Keys,
    validation: Validation,
    tenant_claim: String,
}

/// Key material stays out of logs.
impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("algorithms", &self.validation.algorithms)
            .field("iss", &self.validation.iss)
            .field("aud", &self.validation.aud)
            .field("tenant_claim", &self.tenant_claim)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    pub fn from_raw(raw: &RawJwt, at: &str) -> Result<Self, ConfigError> {
        let f = |name: &str| format!("{at}.{name}");
        let err = |name: &str, why: String| ConfigError::new(f(name), why);
        if raw.algorithms.is_empty() {
            return Err(err(
                "algorithms",
                "name at least one, e.g. [\"RS256\"]".into(),
            ));
        }
        let mut algorithms = Vec::with_capacity(raw.algorithms.len());
        for a in &raw.algorithms {
            let alg: Algorithm = a.parse().map_err(|_| {
                err("algorithms", format!("{a:?} is not one of HS256/384/512, RS256/384/512, PS256/384/512, ES256/384, EdDSA"))
            })?;
            algorithms.push(alg);
        }
        let family = algorithms[0].family();
        if algorithms.iter().any(|a| a.family() != family) {
            return Err(err(
                "algorithms",
                "mixes algorithm families; one key type per verifier (this blocks key-confusion attacks)".into(),
            ));
        }
        let sources = [
            raw.public_key_pem.is_some(),
            raw.public_key_file.is_some(),
            raw.jwks_file.is_some(),
            raw.jwks_url.is_some(),
        ];
        let public_sources = sources.iter().filter(|s| **s).count();
        let keys = if family == jsonwebtoken::AlgorithmFamily::Hmac {
            let secret = raw
                .secret
                .as_ref()
                .ok_or_else(|| err("secret", "required for HS* algorithms".into()))?;
            if public_sources > 0 {
                return Err(err(
                    "secret",
                    "HS* algorithms take a secret, not a public key".into(),
                ));
            }
            if secret.expose().len() < MIN_SECRET_BYTES {
                return Err(err(
                    "secret",
                    format!("must be at least {MIN_SECRET_BYTES} bytes"),
                ));
            }
            let key = DecodingKey::from_secret(secret.expose().as_bytes())
                .map_err(|e| err("secret", e.to_string()))?;
            Keys::One(key)
        } else {
            if raw.secret.is_some() || public_sources != 1 {
                return Err(err(
                    "public_key_pem",
                    "RS*/PS*/ES*/EdDSA take exactly one of public_key_pem, public_key_file, jwks_file or jwks_url, and no secret".into(),
                ));
            }
            if raw.jwks_refresh_s.is_some() && raw.jwks_url.is_none() {
                return Err(err("jwks_refresh_s", "only jwks_url is refreshed".into()));
            }
            if let Some(url) = &raw.jwks_url {
                if !(url.starts_with("https://") || url.starts_with("http://"))
                    || reqwest::Url::parse(url).is_err()
                {
                    return Err(err("jwks_url", format!("{url:?} is not an http(s) URL")));
                }
                let every = raw.jwks_refresh_s.unwrap_or(300);
                if !(10..=86_400).contains(&every) {
                    return Err(err("jwks_refresh_s", "must be between 10 and 86400".into()));
                }
                Keys::Remote(super::jwks_url::shared(
                    url,
                    family,
                    std::time::Duration::from_secs(every),
                ))
            } else if let Some(path) = &raw.jwks_file {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| err("jwks_file", format!("{path}: {e}")))?;
                Keys::Set(
                    key_set(&text, family)
                        .map_err(|why| err("jwks_file", format!("{path}: {why}")))?,
                )
            } else {
                let (field, pem) = match (&raw.public_key_pem, &raw.public_key_file) {
                    (Some(p), _) => ("public_key_pem", p.clone()),
                    (None, Some(path)) => (
                        "public_key_file",
                        std::fs::read_to_string(path)
                            .map_err(|e| err("public_key_file", format!("{path}: {e}")))?,
                    ),
                    (None, None) => return Err(err("public_key_pem", "missing".into())),
                };
                Keys::One(
                    pem_key(pem.as_bytes(), family)
                        .map_err(|e| err(field, format!("not a usable public key: {e}")))?,
                )
            }
        };
        let issuer = raw
            .issuer
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                err(
                    "issuer",
                    "required: without it, tokens minted by any issuer sharing the key pass".into(),
                )
            })?;
        let audience = raw
            .audience
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                err(
                    "audience",
                    "required: without it, tokens minted for other services pass".into(),
                )
            })?;
        let mut validation = Validation::new(algorithms[0]);
        validation.algorithms = algorithms;
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = raw.leeway_seconds.unwrap_or(30).min(300);
        Ok(Self {
            keys,
            validation,
            tenant_claim: raw
                .tenant_claim
                .clone()
                .unwrap_or_else(|| "tenant".to_owned()),
        })
    }

    /// Start refreshing a JWKS URL's keys (no-op for other key sources).
    pub fn start(&self) {
        if let Keys::Remote(r) = &self.keys {
            r.start();
        }
    }

    /// The tenant a token speaks for, or why it is refused (for the client).
    pub fn verify(&self, token: &str) -> Result<Arc<str>, String> {
        let remote;
        let key = match &self.keys {
            Keys::One(k) => k,
            Keys::Set(set) => by_kid(set, token)?,
            Keys::Remote(r) => {
                remote = r.keys();
                by_kid(&remote, token).inspect_err(|_| r.missing_kid())?
            }
        };
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, key, &self.validation)
            .map_err(|e| why(e.kind()))?;
        match data.claims.get(&self.tenant_claim) {
            Some(Value::String(t)) if is_valid_tenant_id(t) => Ok(Arc::from(t.as_str())),
            Some(_) => Err(format!(
                "the `{}` claim is not a valid tenant id",
                self.tenant_claim
            )),
            None => Err(format!("the token has no `{}` claim", self.tenant_claim)),
        }
    }
}

/// The key a token's `kid` names (a one-key set needs none).
fn by_kid<'a>(
    set: &'a [(Option<String>, DecodingKey)],
    token: &str,
) -> Result<&'a DecodingKey, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| why(e.kind()))?;
    let found = match header.kid.as_deref() {
        Some(kid) => set.iter().find(|(k, _)| k.as_deref() == Some(kid)),
        None if set.len() == 1 => set.first(),
        None => None,
    };
    found
        .map(|(_, k)| k)
        .ok_or_else(|| "the token's key id (kid) is not known".to_owned())
}

fn pem_key(
    pem: &[u8],
    family: jsonwebtoken::AlgorithmFamily,
) -> jsonwebtoken::errors::Result<DecodingKey> {
    use jsonwebtoken::AlgorithmFamily as F;
    match family {
        F::Rsa => DecodingKey::from_rsa_pem(pem),
        F::Ec => DecodingKey::from_ec_pem(pem),
        F::Ed => DecodingKey::from_ed_pem(pem),
        F::Hmac => Err(JwtError::InvalidKeyFormat.into()),
    }
}

/// What the client is told. Specific enough to fix a client, never echoing
/// key material or the expected values.
fn why(kind: &JwtError) -> String {
    match kind {
        JwtError::InvalidSignature => "bad signature".into(),
        JwtError::ExpiredSignature => "the token has expired".into(),
        JwtError::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        JwtError::InvalidIssuer => "the token's issuer (iss) is not accepted".into(),
        JwtError::InvalidAudience => "the token's audience (aud) is not accepted".into(),
        JwtError::MissingRequiredClaim(c) => format!("the token has no `{c}` claim"),
        JwtError::InvalidAlgorithm => "the token's algorithm is not accepted".into(),
        JwtError::InvalidClaimFormat(c) => format!("the token's `{c}` claim is malformed"),
        _ => "malformed token".into(),
    }
}
