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
