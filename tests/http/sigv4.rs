//! SigV4-signed tenants over raw HTTP, signed here with `aws-sigv4`: what
//! is refused (and never forwarded), the cap on uploads not yet verified, and
//! a mode list that takes a bearer token or a signature. boto3's own signing
//! is exercised by `sagemaker::boto3_sagemaker_runtime_interop`.

use std::time::Duration;

use super::common::*;
use super::sagemaker::*;

/// What, the signed headers, the body sent, status, `x-amzn-ErrorType`.
type SignedCase = (
    &'static str,
    Vec<(String, String)>,
    &'static [u8],
    u16,
    &'static str,
);

fn sign(
    method: &str,
    url: &str,
    body: &[u8],
    key: &str,
    secret: &str,
    at: std::time::SystemTime,
) -> Vec<(String, String)> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity = aws_credential_types::Credentials::new(key, secret, None, None, "test").into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("sagemaker")
        .time(at)
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    let host = url.split('/').nth(2).unwrap();
    let headers = [("host", host), ("content-type", "application/json")];
    let req =
        SignableRequest::new(method, url, headers.into_iter(), SignableBody::Bytes(body)).unwrap();
    let (instructions, _) = sign(req, &params).unwrap().into_parts();
    let mut out: Vec<(String, String)> = instructions
        .headers()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    out.push(("content-type".into(), "application/json".into()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigv4_tenants_are_verified_before_anything_is_forwarded() {
    let c = Container::start("c0").await;
    let down = closed_port().await;
    let gw = Gateway::start(&sagemaker_config(&[&c], &down, &sigv4_auth())).await;
    let url = gw.url("/endpoints/chat/invocations");
    let body = br#"{"inputs":"hello"}"#;
    let now = std::time::SystemTime::now();
    let send = |headers: Vec<(String, String)>, body: &'static [u8]| {
        let url = url.clone();
        async move {
            let mut req = client().post(url).body(body);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            req.send().await.unwrap()
        }
    };
    let ok = send(sign("POST", &url, body, ACME_KEY, ACME_SECRET, now), body).await;
    assert_eq!(ok.status(), 200);
    let v: serde_json::Value = serde_json::from_slice(&ok.bytes().await.unwrap()).unwrap();
    // The tenant's salt, set by the gateway, reached the container.
    assert!(v["received"]["cache_salt"].is_string(), "{v}");
    let cases: Vec<SignedCase> = vec![
        (
            "wrong secret",
            sign(
                "POST",
                &url,
                body,
                ACME_KEY,
                "not-the-secret-0123456789",
                now,
            ),
            body,
            403,
            "InvalidSignatureException",
        ),
        (
            "unknown key",
            sign("POST", &url, body, "AKIANOBODY", ACME_SECRET, now),
            body,
            403,
            "UnrecognizedClientException",
        ),
        (
            "20 minutes old",
            sign(
                "POST",
                &url,
                body,
                ACME_KEY,
                ACME_SECRET,
                now - Duration::from_secs(1200),
            ),
            body,
            403,
            "InvalidSignatureException",
        ),
        (
            "body changed after signing",
            sign("POST", &url, body, ACME_KEY, ACME_SECRET, now),
            br#"{"inputs":"HELLO"}"#,
            403,
            "InvalidSignatureException",
        ),
        (
            "20 minutes ahead",
            sign(
                "POST",
                &url,
                body,
                ACME_KEY,
                ACME_SECRET,
                now + Duration::from_secs(1200),
            ),
            body,
            403,
            "InvalidSignatureException",
        ),
        (
            "an unsigned x-amz-content-sha256 that is not the body's",
            [
                sign("POST", &url, body, ACME_KEY, ACME_SECRET, now),
                vec![("x-amz-content-sha256".into(), "UNSIGNED-PAYLOAD".into())],
            ]
            .concat(),
            body,
            403,
            "InvalidSignatureException",
        ),
        (
            "a signed header changed after signing",
            sign("POST", &url, body, ACME_KEY, ACME_SECRET, now)
                .into_iter()
                .map(|(k, v)| {
                    let v = if k == "content-type" {
                        "application/json; charset=utf-8".into()
                    } else {
                        v
                    };
                    (k, v)
                })
                .collect(),
            body,
            403,
            "InvalidSignatureException",
        ),
        (
            "no credential",
            vec![],
            body,
            403,
            "MissingAuthenticationTokenException",
        ),
        (
            "garbled",
            vec![("authorization".into(), "AWS4-HMAC-SHA256 nonsense".into())],
            body,
            400,
            "IncompleteSignatureException",
        ),
    ];
    for (what, headers, body, status, code) in cases {
        let resp = send(headers, body).await;
        assert_eq!(resp.status().as_u16(), status, "{what}");
        assert_eq!(error_type(resp.headers()), code, "{what}");
    }
    assert_eq!(c.bodies().len(), 1, "only the valid request was forwarded");
    // Over HTTP/2 there is no Host header: the :authority is what was signed.
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let mut req = h2.post(&url).body(&body[..]);
    for (k, v) in sign("POST", &url, body, ACME_KEY, ACME_SECRET, now) {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    assert_eq!(c.bodies().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_signed_uploads_are_bounded_and_hold_no_tenant_slot() {
    let c = Container::start("c0").await;
    let down = closed_port().await;
    let auth = sigv4_auth()
        .replace(
            "    region: us-east-1\n",
            "    region: us-east-1\n    max_unverified_uploads: 8\n",
        )
        .replace(
            "limited: { requests_per_minute: 1 }",
            "acme: { max_concurrency: 1 }\n    limited: { requests_per_minute: 1 }",
        );
    let yaml = sagemaker_config(&[&c], &down, &auth).replace(
        "  failover_cooldown_ms",
        "  timeouts: { body_read_ms: 1500 }\n  failover_cooldown_ms",
    );
    let gw = Gateway::start(&yaml).await;
    let url = gw.url("/endpoints/chat/invocations");
    let body = br#"{"inputs":"hello"}"#;
    // Two uploads that send their signed headers and never their body.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let headers = sign(
            "POST",
            &url,
            body,
            ACME_KEY,
            ACME_SECRET,
            std::time::SystemTime::now(),
        );
        let mut head = format!(
            "POST /endpoints/chat/invocations HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n",
            gw.addr,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n{\"inp");
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        stalled.push(s);
    }
    // Give them time to reach the gateway and take the two permits.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let send_as = |key: &'static str, secret: &'static str| {
        let url = url.clone();
        async move {
            let mut req = client().post(&url).body(&body[..]);
            for (k, v) in sign(
                "POST",
                &url,
                body,
                key,
                secret,
                std::time::SystemTime::now(),
            ) {
                req = req.header(k, v);
            }
            req.send().await.unwrap()
        }
    };
    // A third is refused while they wait: one access key may hold a quarter
    // of the 8 unverified uploads, 2.
    let third = send_as(ACME_KEY, ACME_SECRET).await;
    assert_eq!(third.status(), 429);
    assert_eq!(error_type(third.headers()), "ThrottlingException");
    // Knowing acme's key id stalls acme's uploads only: another key is served.
    assert_eq!(send_as(LIMITED_KEY, LIMITED_SECRET).await.status(), 200);
    // The stalled ones end with a 4xx at body_read_ms, holding nothing of
    // the tenant: acme (max_concurrency 1) is then served at once.
    for mut s in stalled {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .expect("no answer to a stalled signed upload")
            .unwrap();
        let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 400"), "{text}");
        assert!(text.contains("x-amzn-errortype: validationerror"), "{text}");
    }
    assert_eq!(send_as(ACME_KEY, ACME_SECRET).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_list_accepts_a_bearer_token_or_a_signature() {
    let c = Container::start("c0").await;
    let down = closed_port().await;
    let secret = "jwt-secret-0123456789abcdef0123456789";
    let auth = sigv4_auth().replace(
        "  mode: sigv4\n",
        &format!("  mode: [jwt, sigv4]\n  jwt: {{ algorithms: [HS256], secret: \"{secret}\", issuer: iss, audience: aud }}\n"),
    );
    let gw = Gateway::start(&sagemaker_config(&[&c], &down, &auth)).await;
    let url = gw.url("/endpoints/chat/invocations");
    let body = br#"{"inputs":"hello"}"#;
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"tenant": "acme", "iss": "iss", "aud": "aud", "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap();
    let bearer = client()
        .post(&url)
        .bearer_auth(token)
        .body(&body[..])
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    let mut signed = client().post(&url).body(&body[..]);
    for (k, v) in sign(
        "POST",
        &url,
        body,
        ACME_KEY,
        ACME_SECRET,
        std::time::SystemTime::now(),
    ) {
        signed = signed.header(k, v);
    }
    assert_eq!(signed.send().await.unwrap().status(), 200);
    let none = client().post(&url).body(&body[..]).send().await.unwrap();
    assert_eq!(none.status(), 401);
    assert_eq!(c.bodies().len(), 2);
}
