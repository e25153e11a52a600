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

/// Domain separation for the console's session cookie.
const SESSION_CONTEXT: &[u8] = b"kvgate console session v1\0";

impl AdminToken {
    /// Whether `presented` is the admin token, in time independent of where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&digest).into()
    }

    /// The console's session cookie value: `hex(HMAC-SHA256(digest, context))`.
    /// Derived, so the browser never stores the token itself; stable across
    /// restarts and replicas with the same token; changed with the token.
    pub fn session(&self) -> String {
        // HMAC accepts keys of any length, so this never takes the fallback.
        let Ok(mut mac) = <hmac::Hmac<Sha256> as hmac::KeyInit>::new_from_slice(&self.digest)
        else {
            return String::new();
        };
        hmac::Mac::update(&mut mac, SESSION_CONTEXT);
        hex::encode(hmac::Mac::finalize(mac).into_bytes())
    }

    /// Whether `presented` is the session cookie value, in constant time.
    pub fn session_matches(&self, presented: &str) -> bool {
        let want = self.session();
        !want.is_empty()
            && want.len() == presented.len()
            && bool::from(want.as_bytes().ct_eq(presented.as_bytes()))
    }
}

/// Admit a console call: as [`authorize`] for a Bearer header; otherwise
/// the session cookie named `cookie` must carry [`AdminToken::session`].
pub fn authorize_console(
    token: Option<&AdminToken>,
    headers: &HeaderMap,
    cookie: &str,
) -> Result<(), ApiError> {
    if token.is_none() || headers.contains_key(axum::http::header::AUTHORIZATION) {
        return authorize(token, headers);
    }
    let ok = token.is_some_and(|t| cookies(headers, cookie).any(|v| t.session_matches(v)));
    if ok {
        Ok(())
    } else {
        Err(super::invalid_credentials(
            "the console needs the admin token: sign in, or send Authorization: Bearer <admin.token>",
        ))
    }
}

/// The values of every cookie named `name` in the request's `Cookie` headers.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then_some(v)
        })
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

    #[test]
    fn console_session_cookie() {
        let t = validate(RawAdmin {
            token: Some(Secret::new("a".repeat(32))),
        })
        .unwrap()
        .unwrap();
        let session = t.session();
        assert_eq!(session.len(), 64);
        assert!(!session.contains(&"a".repeat(32)));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("x=1; kvgate_console={session}")).unwrap(),
        );
        assert!(authorize_console(Some(&t), &h, "kvgate_console").is_ok());
        let mut wrong = HeaderMap::new();
        wrong.insert(
            header::COOKIE,
            HeaderValue::from_static("kvgate_console=00"),
        );
        let e = authorize_console(Some(&t), &wrong, "kvgate_console").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthorized);
        let e = authorize_console(None, &h, "kvgate_console").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Forbidden);
        let bearer = with(&format!("Bearer {}", "a".repeat(32)));
        assert!(authorize_console(Some(&t), &bearer, "kvgate_console").is_ok());
    }
}
