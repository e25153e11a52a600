//! Tenancy config validation: every mistake names its field, and secrets
//! never show in `Debug` output.

use super::*;

const BASE: &str = "endpoints:\n  - name: chat\n    models: [\"test-model\"]\n    instances: [{ url: \"http://127.0.0.1:9\" }]\n";

fn field_of(extra: &str) -> String {
    match kvgate::Config::from_yaml(&format!("{BASE}{extra}")) {
        Ok(_) => panic!("accepted:\n{extra}"),
        Err(e) => e.field,
    }
}

fn jwt(lines: &str) -> String {
    format!("auth:\n  mode: jwt\n  jwt:\n{lines}isolation:\n  salt_secret: \"{SALT_SECRET}\"\n")
}

fn sigv4(lines: &str) -> String {
    format!(
        "auth:\n  mode: [jwt, sigv4]\n  jwt: {{ algorithms: [HS256], secret: \"{HS_SECRET}\", issuer: \"{ISSUER}\", audience: \"{AUDIENCE}\" }}\n  sigv4:\n    {lines}\nisolation:\n  salt_secret: \"{SALT_SECRET}\"\n"
    )
}

#[test]
fn mistakes_name_their_field() {
    let hs = format!("    algorithms: [HS256]\n    secret: \"{HS_SECRET}\"\n");
    let iss_aud = format!("    issuer: \"{ISSUER}\"\n    audience: \"{AUDIENCE}\"\n");
    let cases = [
        ("auth:\n  mode: oauth\n".to_owned(), "auth.mode"),
        ("auth:\n  mode: [jwt, jwt]\n".to_owned(), "auth.mode"),
        ("auth:\n  mode: [api_key, jwt]\n".to_owned(), "auth.mode"),
        ("auth:\n  mode: [none, sigv4]\n".to_owned(), "auth.mode"),
        ("auth:\n  mode: []\n".to_owned(), "auth.mode"),
        ("auth:\n  mode: sigv4\n".to_owned(), "auth.sigv4"),
        (
            sigv4(
                "credentials: [{ tenant: a, access_key_id: AKIA1, secret_access_key: \"0123456789abcdef\" }]",
            ),
            "auth.sigv4.region",
        ),
        (sigv4("region: us-east-1"), "auth.sigv4.credentials"),
        (
            sigv4(
                "region: us-east-1\n    credentials: [{ tenant: a, access_key_id: AKIA1, secret_access_key: short }]",
            ),
            "auth.sigv4.credentials[0].secret_access_key",
        ),
        (
            sigv4(
                "region: us-east-1\n    credentials: [{ tenant: \"a b\", access_key_id: AKIA1, secret_access_key: \"0123456789abcdef\" }]",
            ),
            "auth.sigv4.credentials[0].tenant",
        ),
        (
            sigv4(
                "region: us-east-1\n    credentials: [{ tenant: a, access_key_id: \"AKIA/1\", secret_access_key: \"0123456789abcdef\" }]",
            ),
            "auth.sigv4.credentials[0].access_key_id",
        ),
        (
            sigv4(
                "region: us-east-1\n    credentials: [{ tenant: a, access_key_id: AKIA1, secret_access_key: \"0123456789abcdef\" }, { tenant: b, access_key_id: AKIA1, secret_access_key: \"0123456789abcdef\" }]",
            ),
            "auth.sigv4.credentials[1].access_key_id",
        ),
        (
            sigv4(
                "region: us-east-1\n    max_unverified_uploads: 0\n    credentials: [{ tenant: a, access_key_id: AKIA1, secret_access_key: \"0123456789abcdef\" }]",
            ),
            "auth.sigv4.max_unverified_uploads",
        ),
        ("auth:\n  mode: jwt\n".to_owned(), "auth.jwt"),
        (
            "auth:\n  api_keys: [{ tenant: a, sha256: \"00\" }]\n".to_owned(),
            "auth.mode",
        ),
        (
            jwt(&format!(
                "    algorithms: [HS256]\n    secret: short\n{iss_aud}"
            )),
            "auth.jwt.secret",
        ),
        (
            jwt(&format!(
                "    algorithms: [HS256, RS256]\n    secret: \"{HS_SECRET}\"\n{iss_aud}"
            )),
            "auth.jwt.algorithms",
        ),
        (
            jwt(&format!(
                "    algorithms: [XS999]\n    secret: \"{HS_SECRET}\"\n{iss_aud}"
            )),
            "auth.jwt.algorithms",
        ),
        (
            jwt(&format!(
                "{hs}    public_key_file: \"{}\"\n{iss_aud}",
                key_path("rsa_public.pem")
            )),
            "auth.jwt.secret",
        ),
        (
            jwt(&format!(
                "    algorithms: [RS256]\n    public_key_pem: \"not a key\"\n{iss_aud}"
            )),
            "auth.jwt.public_key_pem",
        ),
        (
            jwt(&format!(
                "    algorithms: [ES256]\n    public_key_file: \"{}\"\n{iss_aud}",
                key_path("rsa_public.pem")
            )),
            "auth.jwt.public_key_file",
        ),
        (
            jwt(&format!(
                "    algorithms: [RS256]\n    jwks_file: /nonexistent/jwks.json\n{iss_aud}"
            )),
            "auth.jwt.jwks_file",
        ),
        (
            jwt(&format!(
                "    algorithms: [RS256]\n    jwks_url: \"ftp://idp/jwks\"\n{iss_aud}"
            )),
            "auth.jwt.jwks_url",
        ),
        (
            jwt(&format!(
                "    algorithms: [RS256]\n    jwks_url: \"https://idp/jwks\"\n    jwks_refresh_s: 1\n{iss_aud}"
            )),
            "auth.jwt.jwks_refresh_s",
        ),
        (
            jwt(&format!(
                "    algorithms: [RS256]\n    jwks_file: /x\n    jwks_refresh_s: 60\n{iss_aud}"
            )),
            "auth.jwt.jwks_refresh_s",
        ),
        (
            jwt(&format!("{hs}    audience: \"{AUDIENCE}\"\n")),
            "auth.jwt.issuer",
        ),
        (
            jwt(&format!("{hs}    issuer: \"{ISSUER}\"\n")),
            "auth.jwt.audience",
        ),
        (jwt(&format!("{hs}{iss_aud}    leeway: 5\n")), "(file)"),
        ("auth:\n  mode: api_key\n".to_owned(), "auth.api_keys"),
        (
            "auth:\n  mode: api_key\n  api_keys: [{ tenant: a, sha256: \"sk-live-abc\" }]\n"
                .to_owned(),
            "auth.api_keys[0].sha256",
        ),
        (
            format!(
                "auth:\n  mode: api_key\n  api_keys: [{{ tenant: \"a b\", sha256: \"{}\" }}]\n",
                sha256_hex("k")
            ),
            "auth.api_keys[0].tenant",
        ),
        // Salting is on by default with auth, so it needs its secret.
        (
            format!(
                "auth:\n  mode: api_key\n  api_keys: [{{ tenant: a, sha256: \"{}\" }}]\n",
                sha256_hex("k")
            ),
            "isolation.salt_secret",
        ),
        (
            "isolation:\n  upstream_cache_salt: true\n  salt_secret: short\n".to_owned(),
            "isolation.salt_secret",
        ),
        (
            "tenants:\n  default: { requests_per_minute: 0 }\n".to_owned(),
            "tenants.default.requests_per_minute",
        ),
        (
            "tenants:\n  default: { max_concurrency: 0 }\n".to_owned(),
            "tenants.default.max_concurrency",
        ),
        (
            "tenants:\n  overrides:\n    acme: { models: [\"no/such-model\"] }\n".to_owned(),
            "tenants.overrides.acme.models",
        ),
        (
            "tenants:\n  overrides:\n    acme: { models: [] }\n".to_owned(),
            "tenants.overrides.acme.models",
        ),
        (
            "tenants:\n  default: { weight: -1 }\n".to_owned(),
            "tenants.default.weight",
        ),
        (
            "tenants:\n  overrides:\n    acme: { priority: urgent }\n".to_owned(),
            "tenants.overrides.acme.priority",
        ),
        (
            "queue:\n  output_weight: -2\n".to_owned(),
            "queue.output_weight",
        ),
        ("queue:\n  max_wait_ms: 0\n".to_owned(), "queue.max_wait_ms"),
        (
            "tenants:\n  default: { max_conc: 3 }\n".to_owned(),
            "(file)",
        ),
        ("endpoints_typo: 1\n".to_owned(), "(file)"),
    ];
    for (yaml, field) in cases {
        assert_eq!(field_of(&yaml), field, "{yaml}");
    }
}

#[test]
fn the_interface_from_the_issue_parses_and_hides_secrets() {
    let yaml = format!(
        r#"{BASE}    upstream_api_key: "sk-upstream-secret"
auth:
  mode: jwt
  jwt:
    algorithms: ["HS256"]
    secret: "{HS_SECRET}"
    issuer: "{ISSUER}"
    audience: "{AUDIENCE}"
    tenant_claim: "tenant"
  api_keys: []
tenants:
  default: {{ max_concurrency: 64, requests_per_minute: 600, tokens_per_minute: 200000 }}
  overrides:
    acme: {{ max_concurrency: 2, models: ["test-model"] }}
isolation:
  upstream_cache_salt: true
  salt_secret: "{SALT_SECRET}"
"#
    );
    let c = kvgate::Config::from_yaml(&yaml).unwrap();
    let acme = c.tenancy.tenants.limits("acme");
    assert_eq!(acme.max_concurrency, Some(2));
    // Unset fields of an override inherit the default.
    assert_eq!(acme.requests_per_minute.map(|n| n.get()), Some(600));
    assert_eq!(
        c.tenancy.tenants.limits("anyone-else").max_concurrency,
        Some(64)
    );
    let dump = format!("{c:?}");
    for secret in [HS_SECRET, SALT_SECRET, "sk-upstream-secret"] {
        assert!(!dump.contains(secret), "{secret} in Debug output");
    }
}

/// Secrets mounted as files (a Kubernetes Secret volume): the gateway reads
/// them at load, drops the trailing newline `kubectl create secret` files
/// carry, and a token signed with the file's secret is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_read_from_a_file_authenticates() {
    let up = Upstream::start("u0", Mode::Json).await;
    let dir = std::env::temp_dir().join(format!("kvgate-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (jwt_file, salt_file) = (dir.join("jwt"), dir.join("salt"));
    std::fs::write(&jwt_file, format!("{HS_SECRET}\n")).unwrap();
    std::fs::write(&salt_file, SALT_SECRET).unwrap();
    let inline = jwt_config(&[&up], "");
    let yaml = inline
        .replace(
            &format!("secret: \"{HS_SECRET}\""),
            &format!("secret: {{ file: \"{}\" }}", jwt_file.display()),
        )
        .replace(
            &format!("salt_secret: \"{SALT_SECRET}\""),
            &format!("salt_secret: {{ file: \"{}\" }}", salt_file.display()),
        );
    assert_ne!(yaml, inline, "the config must name the files");
    let gw = Gateway::start(&yaml).await;
    let ok = chat(&gw, &hs256(&claims("acme")), &small_chat("q")).await;
    assert_eq!(ok.status(), 200);
    let wrong = EncodingKey::from_secret(b"another-secret-of-enough-length-0123456789").unwrap();
    let bad = sign(Algorithm::HS256, None, &claims("acme"), &wrong);
    assert_eq!(chat(&gw, &bad, &small_chat("q")).await.status(), 401);

    // A file that is missing names itself; an unknown source is refused.
    std::fs::remove_file(&jwt_file).unwrap();
    let err = kvgate::Config::from_yaml(&yaml).unwrap_err().to_string();
    assert!(err.contains(&jwt_file.display().to_string()), "{err}");
    let err = kvgate::Config::from_yaml(&yaml.replace("{ file:", "{ vault:"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("{ env: NAME } or { file: PATH }"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
