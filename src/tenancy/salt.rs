//! The upstream cache salt: vLLM (≥ 0.9) keeps the KV blocks of requests
//! with different `cache_salt` apart, which closes the prompt-cache timing
//! side channel between tenants (CVE-2025-46570). kvgate sets it from a keyed
//! hash of the tenant id; a client's own `cache_salt` is replaced, never
//! forwarded, or one tenant could claim another's salt.
//!
//! This is the one place where the forwarded body differs from the client's
//! bytes, so it is done cheaply: when the body has no `cache_salt` (the common
//! case) the member is spliced in after the opening `{` — one copy, no parse.
//! Only a body that carries its own is parsed again and re-serialised. The
//! routing key was computed from the client's prompt before, and is not
//! affected either way.

use bytes::{BufMut, Bytes, BytesMut};
use hmac::{KeyInit, Mac};
use serde_json::Value;

use super::secret::Secret;
use crate::error::{ApiError, ErrorKind};

/// Domain separation: the salt key may be reused for other derivations later.
const CONTEXT: &[u8] = b"kvgate upstream cache_salt v1\0";

/// `hex(HMAC-SHA256(salt_secret, context ‖ tenant))`: stable across replicas
/// and restarts, distinct per tenant, and not invertible to the tenant id.
pub fn for_tenant(key: &Secret, tenant: &str) -> String {
    // HMAC accepts keys of any length, so this never takes the fallback.
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.expose().as_bytes()) else {
        return hex::encode(tenant);
    };
    mac.update(CONTEXT);
    mac.update(tenant.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The body with its top-level `cache_salt` set to `salt`. `body` is a JSON
/// object already validated by the pipeline's analysis step; `has_salt` says
/// whether it carries a `cache_salt` member of its own.
pub fn apply(body: &Bytes, salt: &str, has_salt: bool) -> Result<Bytes, ApiError> {
    if has_salt {
        return reserialise(body, salt);
    }
    let open = body
        .iter()
        .position(|&b| !is_ws(b))
        .filter(|&i| body[i] == b'{');
    let Some(open) = open else {
        return Err(not_an_object());
    };
    let rest = &body[open + 1..];
    let empty = rest.iter().find(|&&b| !is_ws(b)) == Some(&b'}');
    let mut out = BytesMut::with_capacity(body.len() + salt.len() + 16);
    out.put_slice(&body[..=open]);
    out.put_slice(b"\"cache_salt\":\"");
    // Hex: nothing in it needs escaping.
    out.put_slice(salt.as_bytes());
    out.put_slice(if empty { b"\"" } else { b"\"," });
    out.put_slice(rest);
    Ok(out.freeze())
}

/// Replace the client's `cache_salt`. serde_json reorders members and writes
/// numbers in its own form; that is the price of a client sending a salt.
fn reserialise(body: &Bytes, salt: &str) -> Result<Bytes, ApiError> {
    let mut value = kvgate_prefix::parse_strict(body).map_err(|e| {
        ApiError::new(
            ErrorKind::InvalidJson,
            // The parser's message already says what and where.
            e.to_string(),
        )
    })?;
    let Value::Object(obj) = &mut value else {
        return Err(not_an_object());
    };
    obj.insert("cache_salt".to_owned(), Value::String(salt.to_owned()));
    serde_json::to_vec(&value).map(Bytes::from).map_err(|e| {
        ApiError::new(
            ErrorKind::Internal,
            format!("could not re-serialise the body: {e}"),
        )
    })
}

fn not_an_object() -> ApiError {
    ApiError::new(
        ErrorKind::InvalidRequest,
        "the request body must be a JSON object",
    )
    .with_param("body")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn salted(body: &str, has: bool) -> Value {
        let out = apply(&Bytes::from(body.to_owned()), "abc123", has).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn salt_is_keyed_and_per_tenant() {
        let k = Secret::new("k1".repeat(16));
        let a = for_tenant(&k, "a");
        assert_eq!(a, for_tenant(&k, "a"));
        assert_ne!(a, for_tenant(&k, "b"));
        assert_ne!(a, for_tenant(&Secret::new("k2".repeat(16)), "a"));
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn splices_after_the_brace() {
        let out = apply(&Bytes::from_static(b" {\"model\":\"m\"}"), "s", false).unwrap();
        assert_eq!(&out[..], b" {\"cache_salt\":\"s\",\"model\":\"m\"}");
        assert_eq!(
            salted("{ }", false),
            serde_json::json!({"cache_salt": "abc123"})
        );
    }

    #[test]
    fn replaces_a_client_salt_even_escaped() {
        let v = salted(r#"{"model":"m","cache\u005fsalt":"victim"}"#, true);
        assert_eq!(v, serde_json::json!({"model": "m", "cache_salt": "abc123"}));
    }

    proptest! {
        #[test]
        fn splice_keeps_every_member(obj in prop::collection::btree_map("[a-z]{1,8}", any::<i32>(), 0..8)) {
            let obj: serde_json::Map<String, Value> =
                obj.into_iter().filter(|(k, _)| k != "cache_salt").map(|(k, v)| (k, Value::from(v))).collect();
            let text = serde_json::to_string_pretty(&Value::Object(obj.clone())).unwrap();
            let mut want = obj;
            want.insert("cache_salt".into(), Value::from("abc123"));
            prop_assert_eq!(salted(&text, false), Value::Object(want));
        }
    }
}
