//! The admin credential: `admin.token`, a bearer token for `/admin/*`, apart
//! from every tenant credential. Kept only as its SHA-256 digest and compared
//! in constant time, so neither the config in memory nor the comparison's
//! timing tells anything about the token.
//!
//! Without `admin.token`, admin routes are off (403): they show the fleet's
//! live traffic and accept any tenant id, so they are opened by choice, not by
//! default. Loopback-only was rejected as a default: behind a reverse proxy on
//! the same host every caller is loopback.

use axum::http::HeaderMap;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::secret::Secret;
use crate::error::{ApiError, ConfigError, ErrorKind};

/// Shortest admin token accepted: 32 bytes, as for the other secrets.
pub const MIN_TOKEN_LEN: usize = 32;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub token: Option<Secret>,
}

/// The digest of the configured admin token.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// Validate the `admin` section: `None` means admin routes are off.
pub fn validate(raw: RawAdmin) -> Result<Option<AdminToken>, ConfigError> {
    let Some(token) = raw.token else {
        return Ok(None);
    };
    let t = token.expose();
    if t.len() < MIN_TOKEN_LEN || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            "admin.token",
            "must be 32 or more visible ASCII characters (e.g. openssl rand -base64 32)",
        ));
    }
    Ok(Some(AdminToken {
        digest: Sha256::digest(t.as_bytes()).into(),
    }))
}

impl AdminToken {
    /// Whether `presented` is the admin token, in time independent of where they differ.
    fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&digest).into()
    }
}

/// Admit an admin call: 403 while admin routes are off, 401 without the admin token.
pub fn authorize(token: Option<&AdminToken>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            "admin routes are off: set admin.token in the config to enable them",
        ));
    };
    let presented = super::bearer(headers)?;
    if token.matches(presented) {
        Ok(())
    } else {
        Err(super::invalid_credentials(
            "admin routes need the admin token (admin.token), not a tenant credential",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, header};

    fn with(v: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        m
    }

    #[test]
    fn token_rules() {
        let raw = |t: &str| RawAdmin {
            token: Some(Secret::new(t)),
        };
        assert!(validate(RawAdmin::default()).unwrap().is_none());
        assert!(validate(raw("short")).is_err());
        assert!(validate(raw(&format!("{} x", "a".repeat(32)))).is_err());
        let t = validate(raw(&"a".repeat(32))).unwrap().unwrap();
        assert!(authorize(Some(&t), &with(&format!("Bearer {}", "a".repeat(32)))).is_ok());
        let wrong = authorize(Some(&t), &with(&format!("Bearer {}", "a".repeat(31))));
        assert_eq!(wrong.unwrap_err().kind, ErrorKind::Unauthorized);
        let missing = authorize(Some(&t), &HeaderMap::new());
        assert_eq!(missing.unwrap_err().kind, ErrorKind::Unauthorized);
        let off = authorize(None, &with("Bearer anything"));
        assert_eq!(off.unwrap_err().kind, ErrorKind::Forbidden);
    }
}
