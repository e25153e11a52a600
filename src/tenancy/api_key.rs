//! API keys, stored only as SHA-256 digests: a leaked config file names the
//! tenants but hands out no usable key.
//!
//! Lookup hashes the presented key and finds the digest in a map. The map's
//! timing can only reveal something about the *digest* of a guess, which is
//! useless to an attacker without a SHA-256 preimage; so no constant-time
//! comparison is needed. Keys are meant to be long random strings (e.g. 32
//! random bytes, base64url), so an unsalted fast hash is enough.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::is_valid_tenant_id;
use super::raw::RawApiKey;
use crate::error::ConfigError;

/// Digest → tenant.
#[derive(Clone)]
pub struct ApiKeys {
    by_digest: HashMap<[u8; 32], Arc<str>>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("keys", &self.by_digest.len())
            .finish()
    }
}

impl ApiKeys {
    pub fn from_raw(raw: &[RawApiKey], at: &str) -> Result<Self, ConfigError> {
        if raw.is_empty() {
            return Err(ConfigError::new(at, "mode api_key needs at least one key"));
        }
        let mut by_digest = HashMap::with_capacity(raw.len());
        for (i, k) in raw.iter().enumerate() {
            let here = |f: &str| format!("{at}[{i}].{f}");
            if !is_valid_tenant_id(&k.tenant) {
                return Err(ConfigError::new(
                    here("tenant"),
                    format!("{:?} must be 1-128 visible ASCII characters", k.tenant),
                ));
            }
            let mut digest = [0u8; 32];
            hex::decode_to_slice(k.sha256.trim(), &mut digest).map_err(|_| {
                ConfigError::new(
                    here("sha256"),
                    "must be 64 hex digits: the SHA-256 of the key, never the key itself",
                )
            })?;
            if by_digest
                .insert(digest, Arc::from(k.tenant.as_str()))
                .is_some()
            {
                return Err(ConfigError::new(
                    here("sha256"),
                    "the same key is listed twice",
                ));
            }
        }
        Ok(Self { by_digest })
    }

    /// The tenant a presented key belongs to.
    pub fn lookup(&self, key: &str) -> Option<Arc<str>> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_digest.get(&digest).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(tenant: &str, key: &str) -> RawApiKey {
        RawApiKey {
            tenant: tenant.into(),
            sha256: hex::encode(Sha256::digest(key.as_bytes())),
        }
    }

    #[test]
    fn finds_by_digest_only() {
        let keys = ApiKeys::from_raw(&[raw("acme", "sk-a"), raw("beta", "sk-b")], "auth.api_keys")
            .unwrap();
        assert_eq!(keys.lookup("sk-a").as_deref(), Some("acme"));
        assert_eq!(keys.lookup("sk-b").as_deref(), Some("beta"));
        assert_eq!(keys.lookup("sk-c"), None);
        assert!(!format!("{keys:?}").contains("acme"));
    }

    #[test]
    fn refuses_clear_keys_and_duplicates() {
        let clear = RawApiKey {
            tenant: "acme".into(),
            sha256: "sk-live-123".into(),
        };
        let e = ApiKeys::from_raw(&[clear], "auth.api_keys").unwrap_err();
        assert_eq!(e.field, "auth.api_keys[0].sha256");
        let e = ApiKeys::from_raw(&[raw("a", "k"), raw("b", "k")], "auth.api_keys").unwrap_err();
        assert_eq!(e.field, "auth.api_keys[1].sha256");
    }
}
