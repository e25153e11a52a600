//! Authentication and authorization: every way a credential can be wrong is
//! a 401 that reaches no upstream; API keys match by digest; a model outside
//! the tenant's list is a 403; the client's credential never reaches an
//! upstream, the endpoint's own does. (Key types: `keys.rs`.)

use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::json;

use super::*;

fn b64(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    // base64url without padding, by hand: the test needs no base64 crate.
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = serde_json::to_vec(v).unwrap();
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=c.len() {
            let _ = write!(out, "{}", A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_credential_is_a_401_and_never_forwarded() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&jwt_config(&[&up], "")).await;
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = claims("acme");
        f(&mut c);
        hs256(&c)
    };
    let other_secret =
        EncodingKey::from_secret(b"another-secret-of-enough-length-0123456789").unwrap();
    let rsa = EncodingKey::from_rsa_pem(&pem("rsa_private.pem")).unwrap();
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no Authorization header", None),
        (
            "Basic scheme",
            Some("Basic YWxhZGRpbjpvcGVuc2VzYW1l".into()),
        ),
        ("Bearer without a token", Some("Bearer".into())),
        ("not a JWT", Some("Bearer not.a.jwt".into())),
        ("garbage", Some("Bearer %%%".into())),
        (
            "bad signature",
            Some(format!(
                "Bearer {}",
                sign(Algorithm::HS256, None, &claims("acme"), &other_secret)
            )),
        ),
        (
            "expired",
            Some(format!(
                "Bearer {}",
                with(&|c| c["exp"] = json!(now() - 3600))
            )),
        ),
        (
            "not yet valid",
            Some(format!(
                "Bearer {}",
                with(&|c| c["nbf"] = json!(now() + 3600))
            )),
        ),
        (
            "wrong issuer",
            Some(format!(
                "Bearer {}",
                with(&|c| c["iss"] = json!("https://evil.example"))
            )),
        ),
        (
            "wrong audience",
            Some(format!(
                "Bearer {}",
                with(&|c| c["aud"] = json!("someone-else"))
            )),
        ),
        (
            "no issuer",
            Some(format!(
                "Bearer {}",
                with(&|c| drop(c.as_object_mut().unwrap().remove("iss")))
            )),
        ),
        (
            "no audience",
            Some(format!(
                "Bearer {}",
                with(&|c| drop(c.as_object_mut().unwrap().remove("aud")))
            )),
        ),
        (
            "no expiry",
            Some(format!(
                "Bearer {}",
                with(&|c| drop(c.as_object_mut().unwrap().remove("exp")))
            )),
        ),
        (
            "no tenant claim",
            Some(format!(
                "Bearer {}",
                with(&|c| drop(c.as_object_mut().unwrap().remove("tenant")))
            )),
        ),
        (
            "tenant claim not a string",
            Some(format!("Bearer {}", with(&|c| c["tenant"] = json!(42)))),
        ),
        (
            "tenant claim with a space",
            Some(format!("Bearer {}", with(&|c| c["tenant"] = json!("a b")))),
        ),
        (
            "alg none",
            Some(format!(
                "Bearer {}.{}.",
                b64(&json!({"alg": "none", "typ": "JWT"})),
                b64(&claims("acme"))
            )),
        ),
        (
            "RS256 when only HS256 is accepted",
            Some(format!(
                "Bearer {}",
                sign(Algorithm::RS256, None, &claims("acme"), &rsa)
            )),
        ),
    ];
    for (what, auth) in cases {
        for path in [
            "/v1/chat/completions",
            "/endpoints/chat/invocations",
            "/v1/models",
        ] {
            let mut req = client()
                .post(gw.url(path))
                .body(serde_json::to_vec(&small_chat("hi")).unwrap());
            if path == "/v1/models" {
                req = client().get(gw.url(path));
            }
            if let Some(a) = &auth {
                req = req.header("authorization", a);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{what} on {path}");
            assert!(
                header(&resp, "www-authenticate").starts_with("Bearer realm=\"kvgate\""),
                "{what}"
            );
            if path.starts_with("/endpoints/") {
                // SageMaker's shape there (tests/http/sagemaker.rs).
                assert_eq!(
                    header(&resp, "x-amzn-errortype"),
                    "UnrecognizedClientException",
                    "{what}"
                );
                continue;
            }
            let v = error_body(resp, what).await;
            assert_eq!(v["error"]["type"], "authentication_error", "{what}: {v}");
            assert_eq!(v["error"]["code"], "invalid_api_key", "{what}: {v}");
        }
    }
    assert_eq!(up.hits(), 0, "a rejected request reached the upstream");
    // The open allow-list needs no credential.
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(
            client().get(gw.url(path)).send().await.unwrap().status(),
            200,
            "{path}"
        );
    }
    // And a good token still works.
    assert_eq!(
        chat(&gw, &hs256(&claims("acme")), &small_chat("hi"))
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_matched_by_digest() {
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml = config_with(
        &[&up],
        &format!(
            "auth:\n  mode: api_key\n  api_keys:\n    - {{ tenant: acme, sha256: \"{}\" }}\n    - {{ tenant: beta, sha256: \"{}\" }}\nisolation:\n  salt_secret: \"{SALT_SECRET}\"\n",
            sha256_hex("sk-acme-1"),
            sha256_hex("sk-beta-1").to_uppercase()
        ),
    );
    let gw = Gateway::start(&yaml).await;
    assert_eq!(chat(&gw, "sk-acme-1", &small_chat("a")).await.status(), 200);
    assert_eq!(chat(&gw, "sk-beta-1", &small_chat("b")).await.status(), 200);
    for bad in ["sk-acme-2", "", &sha256_hex("sk-acme-1")] {
        let resp = post(
            &gw,
            "/v1/chat/completions",
            Some(bad),
            serde_json::to_vec(&small_chat("c")).unwrap(),
        )
        .await;
        assert_eq!(resp.status(), 401, "{bad:?}");
        assert!(resp.headers().contains_key("www-authenticate"));
    }
    assert_eq!(up.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_outside_the_allow_list_are_403() {
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml = jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    acme: { models: [\"other/model-2\"] }\n",
    )
    .replace(
        &format!("models: [\"{MODEL}\"]"),
        &format!("models: [\"{MODEL}\", \"other/model-2\"]"),
    );
    let gw = Gateway::start(&yaml).await;
    let acme = hs256(&claims("acme"));
    let resp = chat(&gw, &acme, &small_chat("hi")).await;
    assert_eq!(resp.status(), 403);
    let v = error_body(resp, "forbidden model").await;
    assert_eq!(v["error"]["type"], "permission_error");
    // The native route reaches every model of the endpoint, so it is refused too.
    let resp = post(
        &gw,
        "/endpoints/chat/invocations",
        Some(&acme),
        r#"{"inputs":"x"}"#,
    )
    .await;
    assert_eq!(resp.status(), 403);
    assert_eq!(up.hits(), 0);
    assert_eq!(
        chat(&gw, &acme, &chat_body("other/model-2", "s", "q", false))
            .await
            .status(),
        200
    );
    // Other tenants are unrestricted.
    assert_eq!(
        chat(&gw, &hs256(&claims("beta")), &small_chat("hi"))
            .await
            .status(),
        200
    );
    // /v1/models lists only what each tenant may use.
    let listed = |token: String| {
        let url = gw.url("/v1/models");
        async move {
            let resp = client().get(url).bearer_auth(token).send().await.unwrap();
            let v: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(acme.clone()).await, vec!["other/model-2".to_owned()]);
    assert_eq!(listed(hs256(&claims("beta"))).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sees_the_endpoint_credential_never_the_clients() {
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml = jwt_config(&[&up], "").replace(
        "  - name: chat\n",
        "  - name: chat\n    upstream_api_key: \"sk-upstream-123\"\n",
    );
    let gw = Gateway::start(&yaml).await;
    let token = hs256(&claims("acme"));
    assert_eq!(chat(&gw, &token, &small_chat("hi")).await.status(), 200);
    let resp = post(
        &gw,
        "/endpoints/chat/invocations",
        Some(&token),
        r#"{"inputs":"x"}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    for seen in up.seen() {
        let auth: Vec<_> = seen.headers.get_all("authorization").iter().collect();
        assert_eq!(auth, ["Bearer sk-upstream-123"], "{}", seen.path);
        assert!(
            seen.headers
                .values()
                .all(|v| !String::from_utf8_lossy(v.as_bytes()).contains(&token))
        );
    }
    // The key is kept out of Debug output (and so out of logs).
    let dump = format!("{:?}", gw.state.runtime.load().config);
    assert!(
        !dump.contains("sk-upstream-123")
            && !dump.contains(HS_SECRET)
            && !dump.contains(SALT_SECRET)
    );

    // Without an endpoint credential, no Authorization header at all.
    let up2 = Upstream::start("u1", Mode::Json).await;
    let gw2 = Gateway::start(&jwt_config(&[&up2], "")).await;
    assert_eq!(chat(&gw2, &token, &small_chat("hi")).await.status(), 200);
    assert!(up2.seen()[0].headers.get("authorization").is_none());
}
