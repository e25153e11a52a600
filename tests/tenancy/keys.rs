//! Every supported key type verifies a good token and refuses a tampered
//! one and the HS256-with-the-public-key confusion: RS256 from a PEM file,
//! ES256 from inline PEM, EdDSA, and RS256 from a JWKS chosen by `kid`.

use jsonwebtoken::{Algorithm, EncodingKey};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_ec_eddsa_and_jwks_keys_verify() {
    let up = Upstream::start("u0", Mode::Json).await;
    let inline_ec = std::fs::read_to_string(key_path("ec_public.pem"))
        .unwrap()
        .replace('\n', "\n      ");
    let setups = [
        (
            "RS256",
            format!("public_key_file: \"{}\"", key_path("rsa_public.pem")),
            Algorithm::RS256,
            "rsa_private.pem",
            None,
        ),
        (
            "ES256",
            format!("public_key_pem: |\n      {inline_ec}"),
            Algorithm::ES256,
            "ec_private.pem",
            None,
        ),
        (
            "EdDSA",
            format!("public_key_file: \"{}\"", key_path("ed_public.pem")),
            Algorithm::EdDSA,
            "ed_private.pem",
            None,
        ),
        (
            "RS256",
            format!("jwks_file: \"{}\"", key_path("jwks.json")),
            Algorithm::RS256,
            "rsa_private.pem",
            Some("test-rsa-1"),
        ),
    ];
    for (alg_name, key_line, alg, private, kid) in setups {
        let yaml = config_with(
            &[&up],
            &format!(
                "auth:\n  mode: jwt\n  jwt:\n    algorithms: [\"{alg_name}\"]\n    {key_line}\n    issuer: \"{ISSUER}\"\n    audience: \"{AUDIENCE}\"\nisolation:\n  salt_secret: \"{SALT_SECRET}\"\n"
            ),
        );
        let gw = Gateway::start(&yaml).await;
        let key = match alg {
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem(private)),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem(private)),
            _ => EncodingKey::from_rsa_pem(&pem(private)),
        }
        .unwrap();
        let good = sign(alg, kid, &claims("acme"), &key);
        assert_eq!(
            chat(&gw, &good, &small_chat("hi")).await.status(),
            200,
            "{alg_name} {key_line}"
        );
        // Same key, tampered payload: the signature no longer matches.
        let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
        parts[1] = sign(alg, kid, &claims("mallory"), &key)
            .split('.')
            .nth(1)
            .unwrap()
            .to_owned();
        assert_eq!(
            chat(&gw, &parts.join("."), &small_chat("hi"))
                .await
                .status(),
            401,
            "{alg_name} tampered"
        );
        // An HS256 token made with the public key as its secret: key confusion.
        let public = pem("rsa_public.pem");
        let confused = sign(
            Algorithm::HS256,
            kid,
            &claims("acme"),
            &EncodingKey::from_secret(&public).unwrap(),
        );
        assert_eq!(
            chat(&gw, &confused, &small_chat("hi")).await.status(),
            401,
            "{alg_name} confusion"
        );
        if kid.is_some() {
            let unknown = sign(alg, Some("other-kid"), &claims("acme"), &key);
            assert_eq!(
                chat(&gw, &unknown, &small_chat("hi")).await.status(),
                401,
                "unknown kid"
            );
        }
    }
}

/// `jwks_url`: the keys are fetched from the provider at start, a token
/// signed under a key id the set lacks is refused and makes the gateway
/// refetch (key rotation), and a reload keeps the fetched keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_is_fetched_and_refetched_when_keys_rotate() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let up = Upstream::start("u0", Mode::Json).await;
    let original = std::fs::read_to_string(key_path("jwks.json")).unwrap();
    let served = Arc::new(std::sync::Mutex::new(original.clone()));
    let fetches = Arc::new(AtomicUsize::new(0));
    let app = {
        let (served, fetches) = (Arc::clone(&served), Arc::clone(&fetches));
        axum::Router::new().route(
            "/.well-known/jwks.json",
            axum::routing::get(move || {
                let (served, fetches) = (Arc::clone(&served), Arc::clone(&fetches));
                async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    let body = served.lock().unwrap().clone();
                    ([("content-type", "application/json")], body)
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let yaml = config_with(
        &[&up],
        &format!(
            "auth:\n  mode: jwt\n  jwt:\n    algorithms: [RS256]\n    jwks_url: \"{url}\"\n    issuer: \"{ISSUER}\"\n    audience: \"{AUDIENCE}\"\nisolation:\n  salt_secret: \"{SALT_SECRET}\"\n"
        ),
    );
    let gw = Gateway::start(&yaml).await;
    let key = EncodingKey::from_rsa_pem(&pem("rsa_private.pem")).unwrap();
    let first = sign(Algorithm::RS256, Some("test-rsa-1"), &claims("acme"), &key);
    // Refetches on an unknown kid are at most one per 10 s: poll up to 30 s.
    let ok_within = |token: String| {
        let gw = &gw;
        async move {
            for _ in 0..300 {
                if chat(gw, &token, &small_chat("hi")).await.status() == 200 {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        }
    };
    assert!(ok_within(first.clone()).await, "the fetched key verifies");

    // The provider rotates: the same key pair now under a new id.
    *served.lock().unwrap() = original.replace("test-rsa-1", "test-rsa-2");
    let rotated = sign(Algorithm::RS256, Some("test-rsa-2"), &claims("acme"), &key);
    let before = fetches.load(Ordering::SeqCst);
    assert_eq!(
        chat(&gw, &rotated, &small_chat("hi")).await.status(),
        401,
        "an unknown kid is refused until the set is refetched"
    );
    assert!(ok_within(rotated.clone()).await, "the rotated key verifies");
    assert!(
        fetches.load(Ordering::SeqCst) > before,
        "refetched on the unknown kid"
    );
    assert_eq!(
        chat(&gw, &first, &small_chat("hi")).await.status(),
        401,
        "a key the provider dropped no longer verifies"
    );

    // A reload keeps the keys it has: no request fails for want of a fetch.
    *served.lock().unwrap() = "{\"keys\": []}".to_owned();
    gw.state
        .reload(kvgate::Config::from_yaml(&yaml).unwrap())
        .unwrap();
    assert_eq!(chat(&gw, &rotated, &small_chat("hi")).await.status(), 200);
}
