//! AWS Signature Version 4, verified as SageMaker does for boto3 (signing
//! name `sagemaker`): parse `Authorization: AWS4-HMAC-SHA256 Credential=…,
//! SignedHeaders=…, Signature=…`, find the access key, check the scope and the
//! date (±5 minutes, as AWS), then recompute the signature over exactly the
//! headers the client signed and the body's SHA-256 with `aws-sigv4` (the AWS
//! SDK's own signer) and compare in constant time.
//!
//! Verification takes two steps because the signature covers the body:
//! [`Sigv4Verifier::begin`] checks everything the headers carry and takes one
//! of a bounded number of "unverified upload" permits (so that an access key
//! id alone cannot tie up more than that); [`Pending::verify`] runs once the
//! body is read. Only then is the caller a tenant and may claim its quotas.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_types::DateTime;
use aws_smithy_types::date_time::Format;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, ErrorKind};

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The signing name boto3 uses for `sagemaker-runtime`.
const SERVICE: &str = "sagemaker";
/// How far the signing time may be from the gateway's clock, as AWS allows.
pub const MAX_SKEW: Duration = Duration::from_secs(5 * 60);

/// One configured access key.
pub struct Credential {
    pub tenant: Arc<str>,
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// The configured keys of `auth.sigv4`, and the cap on uploads not yet verified.
pub struct Sigv4Verifier {
    region: String,
    keys: HashMap<String, (Arc<str>, Arc<str>)>,
    unverified: Arc<Semaphore>,
    /// Each access key id's own share of the permits (a quarter of them).
    per_key: HashMap<String, Arc<Semaphore>>,
    max_unverified: usize,
}

/// The permit pools, by (access key id or "" for the whole pool, size), kept
/// for the process: a reload builds a new verifier, and uploads still being
/// received must keep counting against the same pools.
static POOLS: std::sync::Mutex<Vec<Pool>> = std::sync::Mutex::new(Vec::new());

/// (access key id, permits) and the pool, while anything holds it.
type Pool = ((String, usize), std::sync::Weak<Semaphore>);

fn pool(key: &str, permits: usize) -> Arc<Semaphore> {
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    pools.retain(|(_, w)| w.strong_count() > 0);
    if let Some(live) = pools
        .iter()
        .find(|((k, n), _)| k == key && *n == permits)
        .and_then(|(_, w)| w.upgrade())
    {
        return live;
    }
    let fresh = Arc::new(Semaphore::new(permits));
    pools.push(((key.to_owned(), permits), Arc::downgrade(&fresh)));
    fresh
}

impl std::fmt::Debug for Sigv4Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sigv4Verifier")
            .field("region", &self.region)
            .field("keys", &self.keys.len())
            .field("max_unverified_uploads", &self.max_unverified)
            .finish()
    }
}

/// Whether a request carries a SigV4 `Authorization` header.
pub fn is_signed(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes().starts_with(ALGORITHM.as_bytes()))
}

fn incomplete(why: &str) -> ApiError {
    ApiError::new(
        ErrorKind::IncompleteSignature,
        format!("the SigV4 Authorization header is incomplete: {why}"),
    )
}

fn invalid(why: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::InvalidSignature, why)
}

/// The parts of `Authorization: AWS4-HMAC-SHA256 …`.
#[derive(Debug, PartialEq, Eq)]
struct Parsed<'a> {
    access_key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    terminator: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse(value: &str) -> Result<Parsed<'_>, ApiError> {
    let rest = value
        .strip_prefix(ALGORITHM)
        .filter(|r| r.starts_with(' '))
        .ok_or_else(|| incomplete("it must start with AWS4-HMAC-SHA256"))?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or_else(|| incomplete("each part is Name=value"))?;
        let slot = match k {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed,
            "Signature" => &mut signature,
            _ => return Err(incomplete(&format!("unknown part {k:?}"))),
        };
        if slot.replace(v).is_some() {
            return Err(incomplete(&format!("{k} appears twice")));
        }
    }
    let (Some(credential), Some(signed), Some(signature)) = (credential, signed, signature) else {
        return Err(incomplete(
            "Credential, SignedHeaders and Signature are required",
        ));
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [access_key_id, date, region, service, terminator] = scope.as_slice() else {
        return Err(incomplete(
            "Credential is <key id>/<date>/<region>/<service>/aws4_request",
        ));
    };
    let signed_headers: Vec<&str> = signed.split(';').collect();
    if signed_headers.iter().any(|h| h.is_empty()) {
        return Err(incomplete("SignedHeaders has an empty name"));
    }
    Ok(Parsed {
        access_key_id,
        date,
        region,
        service,
        terminator,
        signed_headers,
        signature,
    })
}

/// `X-Amz-Date` (ISO 8601 basic, `20261201T141755Z`) as a time.
fn amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        s.get(0..4)?,
        s.get(4..6)?,
        s.get(6..8)?,
        s.get(9..11)?,
        s.get(11..13)?,
        s.get(13..15)?
    );
    let t = DateTime::from_str(&rfc3339, Format::DateTime).ok()?;
    SystemTime::try_from(t).ok()
}

/// A request whose headers check out, waiting for its body.
pub struct Pending {
    tenant: Arc<str>,
    access_key_id: String,
    secret: Arc<str>,
    region: String,
    time: SystemTime,
    signed_headers: Vec<String>,
    signature: String,
    _permit: OwnedSemaphorePermit,
    _key_permit: Option<OwnedSemaphorePermit>,
}

impl Sigv4Verifier {
    pub fn new(region: String, credentials: Vec<Credential>, max_unverified: usize) -> Self {
        let keys: HashMap<String, (Arc<str>, Arc<str>)> = credentials
            .into_iter()
            .map(|c| {
                (
                    c.access_key_id,
                    (c.tenant, Arc::from(c.secret_access_key.as_str())),
                )
            })
            .collect();
        // One key id (which is not a secret) can stall at most its own share
        // of the unverified uploads, never every SigV4 tenant's.
        let share = max_unverified.div_ceil(4).max(1);
        let per_key = keys.keys().map(|k| (k.clone(), pool(k, share))).collect();
        Self {
            region,
            keys,
            unverified: pool("", max_unverified),
            per_key,
            max_unverified,
        }
    }

    /// Check what the headers say, before the body is read: 400 for a
    /// malformed header, 403 for an unknown key, a scope that is not ours or a
    /// stale date, 429 when too many signed uploads are still unverified.
    pub fn begin(&self, headers: &HeaderMap, now: SystemTime) -> Result<Pending, ApiError> {
        let mut all = headers.get_all(header::AUTHORIZATION).iter();
        let (Some(value), None) = (all.next(), all.next()) else {
            return Err(incomplete("send exactly one Authorization header"));
        };
        let value = value
            .to_str()
            .map_err(|_| incomplete("the header is not ASCII"))?;
        let p = parse(value)?;
        let Some((tenant, secret)) = self.keys.get(p.access_key_id) else {
            return Err(ApiError::new(
                ErrorKind::UnrecognizedClient,
                "The security token included in the request is invalid: unknown access key id",
            ));
        };
        if p.service != SERVICE || p.terminator != "aws4_request" {
            return Err(invalid(format!(
                "Credential should be scoped to the service {SERVICE:?} with aws4_request"
            )));
        }
        if p.region != self.region {
            return Err(invalid(format!(
                "Credential should be scoped to a valid region: {:?}",
                self.region
            )));
        }
        let date = headers
            .get("x-amz-date")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| invalid("X-Amz-Date is required (and must be signed)"))?;
        let time = amz_date(date).ok_or_else(|| invalid("X-Amz-Date is not yyyyMMddTHHmmssZ"))?;
        if !date.starts_with(p.date) || p.date.len() != 8 {
            return Err(invalid("the Credential's date is not the X-Amz-Date's"));
        }
        let skew = now
            .duration_since(time)
            .or_else(|e| Ok::<_, ApiError>(e.duration()))?;
        if skew > MAX_SKEW {
            return Err(invalid(format!(
                "Signature expired: {date} is more than 5 minutes from the gateway's time"
            )));
        }
        for required in ["host", "x-amz-date"] {
            if !p.signed_headers.contains(&required) {
                return Err(invalid(format!("{required} must be a signed header")));
            }
        }
        let busy = || {
            ApiError::new(
                ErrorKind::RateLimited,
                "this access key's signed uploads are already being received: retry shortly",
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
        };
        let key_permit = self
            .per_key
            .get(p.access_key_id)
            .map(|s| Arc::clone(s).try_acquire_owned().map_err(|_| busy()))
            .transpose()?;
        let permit = Arc::clone(&self.unverified)
            .try_acquire_owned()
            .map_err(|_| {
                ApiError::new(
                    ErrorKind::RateLimited,
                    format!(
                        "{} signed uploads are already being received: retry shortly",
                        self.max_unverified
                    ),
                )
                .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
            })?;
        Ok(Pending {
            tenant: Arc::clone(tenant),
            access_key_id: p.access_key_id.to_owned(),
            secret: Arc::clone(secret),
            region: self.region.clone(),
            time,
            signed_headers: p.signed_headers.iter().map(|s| (*s).to_owned()).collect(),
            signature: p.signature.to_owned(),
            _permit: permit,
            _key_permit: key_permit,
        })
    }
}

impl Pending {
    /// Recompute the signature over the request as received; the tenant if it matches.
    pub fn verify(
        self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Arc<str>, ApiError> {
        let body_hash = hex::encode(Sha256::digest(body));
        if headers
            .get("x-amz-content-sha256")
            .is_some_and(|declared| declared.as_bytes() != body_hash.as_bytes())
        {
            return Err(invalid(
                "the body does not match x-amz-content-sha256 (unsigned payloads are not accepted)",
            ));
        }
        // HTTP/2 has no Host header; its authority is what was signed as host.
        let authority = uri.authority().map(|a| a.as_str().to_owned());
        let mut signed: Vec<(&str, &str)> = Vec::with_capacity(self.signed_headers.len());
        for name in &self.signed_headers {
            let mut values = headers.get_all(name.as_str()).iter().peekable();
            if values.peek().is_none() {
                match (name.as_str(), authority.as_deref()) {
                    ("host", Some(a)) => signed.push((name, a)),
                    _ => return Err(invalid(format!("the signed header {name} is missing"))),
                }
            }
            for v in values {
                let v = v
                    .to_str()
                    .map_err(|_| invalid(format!("the signed header {name} is not ASCII")))?;
                signed.push((name, v));
            }
        }
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let request = SignableRequest::new(
            method.as_str(),
            path,
            signed.into_iter(),
            SignableBody::Precomputed(body_hash),
        )
        .map_err(|e| invalid(format!("the request cannot be signed: {e}")))?;
        let identity = Credentials::new(
            self.access_key_id.as_str(),
            &*self.secret,
            None,
            None,
            "kvgate",
        )
        .into();
        let mut settings = SigningSettings::default();
        // Sign exactly what the client listed: nothing left out by default.
        settings.excluded_headers = None;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SERVICE)
            .time(self.time)
            .settings(settings)
            .build()
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("SigV4 parameters: {e}")))?
            .into();
        let expected = sign(request, &params)
            .map_err(|e| invalid(format!("the request cannot be signed: {e}")))?;
        let ok: bool = expected
            .signature()
            .as_bytes()
            .ct_eq(self.signature.as_bytes())
            .into();
        if !ok {
            return Err(invalid(
                "The request signature we calculated does not match the signature you provided: check the secret access key, and that nothing changed after signing",
            ));
        }
        Ok(self.tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_headers_parse() {
        let p = parse("AWS4-HMAC-SHA256 Credential=AKID/20261201/us-east-1/sagemaker/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc").unwrap();
        assert_eq!(p.access_key_id, "AKID");
        assert_eq!(p.signed_headers, ["host", "x-amz-date"]);
        assert_eq!(p.signature, "abc");
        assert!(
            parse("AWS4-HMAC-SHA256 Credential=AKID/x, SignedHeaders=host, Signature=a").is_err()
        );
        assert!(parse("AWS4-HMAC-SHA256").is_err());
        assert!(
            parse("AWS4-HMAC-SHA256x Credential=a/b/c/d/e, SignedHeaders=h, Signature=s").is_err()
        );
    }

    #[test]
    fn amz_dates() {
        let t = amz_date("20261201T141755Z").unwrap();
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 1_796_134_675);
        assert!(amz_date("2026-12-01T14:17:55Z").is_none());
        assert!(amz_date("20261301T141755Z").is_none());
    }
}
