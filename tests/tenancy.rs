//! Tenant isolation as a client sees it: authentication failures, quotas,
//! placement and upstream cache salts per tenant, the client's credential
//! kept from upstreams, and hostile input answered with a 4xx while the
//! gateway keeps serving. Real gateway, real upstreams, ephemeral ports.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

#[path = "common/mod.rs"]
mod common;

#[path = "tenancy/admin.rs"]
mod admin;
#[path = "tenancy/auth.rs"]
mod auth;
#[path = "tenancy/cluster.rs"]
mod cluster;
#[path = "tenancy/config.rs"]
mod config;
#[path = "tenancy/fair_queue.rs"]
mod fair_queue;
#[path = "tenancy/hostile.rs"]
mod hostile;
#[path = "tenancy/isolation.rs"]
mod isolation;
#[path = "tenancy/keys.rs"]
mod keys;
#[path = "tenancy/openai.rs"]
mod openai;
#[path = "tenancy/parsing.rs"]
mod parsing;
#[path = "tenancy/quota.rs"]
mod quota;
#[path = "tenancy/replicas.rs"]
mod replicas;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const MODEL: &str = "test-model";
pub const ISSUER: &str = "https://auth.example.test";
pub const AUDIENCE: &str = "kvgate";
/// 32+ bytes, as the config requires of HS256 secrets.
pub const HS_SECRET: &str = "test-only-hs256-secret-0123456789abcdef";
pub const SALT_SECRET: &str = "test-only-salt-secret-0123456789";

pub fn key_path(name: &str) -> String {
    format!("{}/fixtures/keys/{name}", env!("CARGO_MANIFEST_DIR"))
}

pub fn pem(name: &str) -> Vec<u8> {
    std::fs::read(key_path(name)).unwrap()
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Valid claims for `tenant`, an hour to live.
pub fn claims(tenant: &str) -> Value {
    json!({"tenant": tenant, "iss": ISSUER, "aud": AUDIENCE, "iat": now(), "exp": now() + 3600})
}

pub fn hs256(claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        None,
        claims,
        &EncodingKey::from_secret(HS_SECRET.as_bytes()).unwrap(),
    )
}

pub fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
    let mut h = Header::new(alg);
    h.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&h, claims, key).unwrap()
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// The common one-endpoint config plus YAML sections appended at top level.
pub fn config_with(upstreams: &[&Upstream], extra: &str) -> String {
    format!("{}{extra}", config(MODEL, upstreams, "prefix_aware", 10))
}

/// `auth.mode: jwt` with HS256, salting on, and these `tenants:` lines.
pub fn jwt_config(upstreams: &[&Upstream], tenants: &str) -> String {
    config_with(
        upstreams,
        &format!(
            r#"auth:
  mode: jwt
  jwt:
    algorithms: ["HS256"]
    secret: "{HS_SECRET}"
    issuer: "{ISSUER}"
    audience: "{AUDIENCE}"
    tenant_claim: tenant
isolation:
  upstream_cache_salt: true
  salt_secret: "{SALT_SECRET}"
{tenants}"#
        ),
    )
}

/// POST a body to a path with an optional bearer token.
pub async fn post(
    gw: &Gateway,
    path: &str,
    token: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    let mut req = client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    req.send().await.unwrap()
}

pub async fn chat(gw: &Gateway, token: &str, body: &Value) -> reqwest::Response {
    post(
        gw,
        "/v1/chat/completions",
        Some(token),
        serde_json::to_vec(body).unwrap(),
    )
    .await
}

pub fn small_chat(question: &str) -> Value {
    chat_body(MODEL, "sys", question, false)
}

/// An OpenAI-shaped error body, checked for shape; returns it.
pub async fn error_body(resp: reqwest::Response, what: &str) -> Value {
    assert_eq!(resp.headers()["content-type"], "application/json", "{what}");
    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: {v}"
    );
    assert!(v["error"]["type"].is_string(), "{what}: {v}");
    assert!(v["error"]["code"].is_string(), "{what}: {v}");
    v
}

/// Send until `f` says the answer is what we wait for; up to 10 s.
pub async fn until<F, Fut>(
    what: &str,
    mut send: F,
    want: impl Fn(&reqwest::Response) -> bool,
) -> reqwest::Response
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    for _ in 0..200 {
        let resp = send().await;
        if want(&resp) {
            return resp;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

pub fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header"))
}
