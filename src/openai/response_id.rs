//! Response ids that carry their instance. vLLM keeps a stored response on the
//! instance that made it, so a follow-up (`previous_response_id`) or a
//! retrieve must reach that instance — from any gateway replica, after any
//! restart. kvgate hands the client an id that names the endpoint, the
//! instance and the upstream's own id, bound to the tenant by an HMAC under
//! `tenancy.salt_secret`:
//!
//! ```text
//! resp_kvg1_<hex(endpoint ‖ 0 ‖ instance ‖ 0 ‖ upstream id)>_<hex(HMAC-SHA256(secret, context ‖ tenant ‖ 0 ‖ that)[..12])>
//! ```
//!
//! Nothing is stored, so nothing is shared or bounded. Another tenant's id
//! fails the HMAC and reads as unknown (404), exactly like an id never issued.
//! Without a salt secret the HMAC key is empty: ids still carry their
//! instance, but one tenant who learned another's id could use it.
//!
//! The ids in answers are rewritten in passing (JSON bodies, and SSE event by
//! event): the values of `id`, `response_id` and `previous_response_id` that
//! start with `resp_`. Client text cannot forge such a member, since quotes
//! inside JSON strings are escaped.

use hmac::{KeyInit, Mac};

const PREFIX: &str = "resp_kvg1_";
const CONTEXT: &[u8] = b"kvgate response id v1\0";
const MAC_BYTES: usize = 12;

/// Who a response id is issued to and checked for.
#[derive(Debug, Clone)]
pub struct IdScope {
    /// `tenancy.salt_secret`, or empty.
    pub key: std::sync::Arc<[u8]>,
    pub tenant: String,
}

/// What a kvgate response id names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The instance's tag ([`IdScope::tag`]).
    pub tag: [u8; TAG_BYTES],
    pub upstream: String,
}

const TAG_BYTES: usize = 8;

impl IdScope {
    pub fn new(secret: Option<&crate::tenancy::settings::Secret>, tenant: &str) -> Self {
        Self {
            key: secret.map_or(&[][..], |s| s.expose().as_bytes()).into(),
            tenant: tenant.to_owned(),
        }
    }

    fn hmac(&self, parts: &[&[u8]]) -> Vec<u8> {
        // HMAC takes keys of any length; the fallback is never taken.
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.key) else {
            return Vec::new();
        };
        for p in parts {
            mac.update(p);
        }
        mac.finalize().into_bytes().to_vec()
    }

    fn mac(&self, payload: &[u8]) -> Vec<u8> {
        let mut m = self.hmac(&[CONTEXT, self.tenant.as_bytes(), &[0], payload]);
        m.truncate(MAC_BYTES);
        m
    }

    /// An instance's opaque name in ids: the same on every replica, and no
    /// instance URL reaches a client.
    pub fn tag(&self, endpoint: &str, instance: &str) -> [u8; TAG_BYTES] {
        let m = self.hmac(&[
            b"instance\0",
            endpoint.as_bytes(),
            &[0],
            instance.as_bytes(),
        ]);
        let mut tag = [0; TAG_BYTES];
        for (t, b) in tag.iter_mut().zip(m) {
            *t = b;
        }
        tag
    }

    /// The id the client sees for the upstream's `upstream` on `instance`.
    pub fn encode(&self, endpoint: &str, instance: &str, upstream: &str) -> String {
        let mut payload = self.tag(endpoint, instance).to_vec();
        payload.extend_from_slice(upstream.as_bytes());
        format!(
            "{PREFIX}{}_{}",
            hex::encode(&payload),
            hex::encode(self.mac(&payload))
        )
    }

    /// The instance of `endpoint` an issued id names, if it is still there.
    pub fn instance_of<'a>(
        &self,
        issued: &Issued,
        endpoint: &str,
        instances: impl IntoIterator<Item = &'a str>,
    ) -> Option<&'a str> {
        instances
            .into_iter()
            .find(|id| self.tag(endpoint, id) == issued.tag)
    }

    /// What an id names, if kvgate issued it to this tenant.
    pub fn decode(&self, id: &str) -> Option<Issued> {
        let (payload, mac) = id.strip_prefix(PREFIX)?.split_once('_')?;
        let payload = hex::decode(payload).ok()?;
        let mac = hex::decode(mac).ok()?;
        // Constant time: the MAC is a credential of sorts.
        let expected = self.mac(&payload);
        if mac.len() != expected.len()
            || mac.iter().zip(&expected).fold(0u8, |d, (a, b)| d | (a ^ b)) != 0
        {
            return None;
        }
        let (tag, upstream) = payload.split_at_checked(TAG_BYTES)?;
        Some(Issued {
            tag: tag.try_into().ok()?,
            upstream: String::from_utf8(upstream.to_vec()).ok()?,
        })
    }
}

/// Replace string values of members named in `keys`: `f` gets each value and
/// returns its replacement, or `None` to keep it. Values with escapes are kept
/// (ids have none). Returns `None` when nothing changed.
pub fn replace_values(
    hay: &[u8],
    keys: &[&str],
    mut f: impl FnMut(&str) -> Option<String>,
) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut copied = 0;
    let mut at = 0;
    while let Some(q) = memchr::memchr(b'"', &hay[at..]).map(|q| at + q) {
        at = q + 1;
        if escaped(hay, q) {
            continue;
        }
        let Some(key) = keys
            .iter()
            .find(|k| hay[at..].starts_with(k.as_bytes()) && hay.get(at + k.len()) == Some(&b'"'))
        else {
            continue;
        };
        let mut v = at + key.len() + 1;
        v = skip_ws(hay, v);
        if hay.get(v) != Some(&b':') {
            continue;
        }
        v = skip_ws(hay, v + 1);
        if hay.get(v) != Some(&b'"') {
            continue;
        }
        let start = v + 1;
        let Some(len) = memchr::memchr2(b'"', b'\\', &hay[start..]) else {
            break;
        };
        let end = start + len;
        at = end;
        if hay[end] != b'"' {
            continue;
        }
        let Some(new) = std::str::from_utf8(&hay[start..end]).ok().and_then(&mut f) else {
            continue;
        };
        out.extend_from_slice(&hay[copied..start]);
        out.extend_from_slice(new.as_bytes());
        copied = end;
    }
    if copied == 0 {
        return None;
    }
    out.extend_from_slice(&hay[copied..]);
    Some(out)
}

fn escaped(hay: &[u8], quote: usize) -> bool {
    hay[..quote]
        .iter()
        .rev()
        .take_while(|&&b| b == b'\\')
        .count()
        % 2
        == 1
}

fn skip_ws(hay: &[u8], mut i: usize) -> usize {
    while hay.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The members of an answer that hold response ids.
pub const ANSWER_KEYS: &[&str] = &["id", "response_id", "previous_response_id"];

/// An answer's bytes with the upstream's response ids replaced by kvgate's.
pub fn rewrite_answer(
    hay: &[u8],
    scope: &IdScope,
    endpoint: &str,
    instance: &str,
) -> Option<Vec<u8>> {
    replace_values(hay, ANSWER_KEYS, |v| {
        (v.starts_with("resp_") && !v.starts_with(PREFIX))
            .then(|| scope.encode(endpoint, instance, v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(tenant: &str) -> IdScope {
        IdScope {
            key: b"0123456789abcdef0123456789abcdef"[..].into(),
            tenant: tenant.into(),
        }
    }

    #[test]
    fn ids_round_trip_for_their_tenant_only() {
        let a = scope("a");
        let id = a.encode("chat", "http://10.0.0.1:8000", "resp_123");
        assert!(id.starts_with("resp_kvg1_"), "{id}");
        let got = a.decode(&id).unwrap();
        assert_eq!(got.tag, a.tag("chat", "http://10.0.0.1:8000"));
        assert_ne!(got.tag, a.tag("chat", "http://10.0.0.2:8000"));
        assert_eq!(got.upstream, "resp_123");
        assert!(
            !id.contains(&hex::encode("10.0.0.1")),
            "no instance URL in the id"
        );
        assert_eq!(scope("b").decode(&id), None, "another tenant's id");
        let mut forged = id.clone();
        forged.pop();
        forged.push(if id.ends_with('0') { '1' } else { '0' });
        assert_eq!(a.decode(&forged), None);
        assert_eq!(a.decode("resp_abc"), None);
        assert_eq!(a.decode("resp_kvg1_zz_00"), None);
    }

    #[test]
    fn answers_have_their_response_ids_replaced_and_nothing_else() {
        let a = scope("a");
        let body = br#"{"id":"resp_1","output":[{"id":"msg_2","content":[{"text":"\"id\":\"resp_9\""}]}],"previous_response_id" : "resp_0","x":{"id":"resp_1"}}"#;
        let out = String::from_utf8(rewrite_answer(body, &a, "e", "i").unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            a.decode(v["id"].as_str().unwrap()).unwrap().upstream,
            "resp_1"
        );
        assert_eq!(v["x"]["id"], v["id"]);
        assert_eq!(
            a.decode(v["previous_response_id"].as_str().unwrap())
                .unwrap()
                .upstream,
            "resp_0"
        );
        assert_eq!(v["output"][0]["id"], "msg_2");
        assert_eq!(v["output"][0]["content"][0]["text"], "\"id\":\"resp_9\"");
        assert_eq!(
            rewrite_answer(br#"{"id":"chatcmpl-1"}"#, &a, "e", "i"),
            None
        );
    }
}
