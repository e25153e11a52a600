//! The console (`/console`) in a real browser: Debian's chromium through
//! chromedriver, driven by tests/sdk/console_browser.py (selenium, from
//! tests/sdk/requirements.txt), against this gateway in front of three
//! kvgate-sim instances. The script checks the page, the decisions, the
//! explain view, the refusals and the security answers, and asks for an
//! instance to be killed (a `KILL` line); it writes the screenshots into
//! docs/console/. The same console's answers are checked here without a
//! browser too: off without `admin.token`, and the config view redacted.

use super::*;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};

const HS_SECRET: &str = "console-test-jwt-secret-0123456789abcdef";
const SALT_SECRET: &str = "console-test-salt-secret-0123456789abcdef";
const REDIS_PASSWORD: &str = "console-test-redis-password-0123456789";
const HEALTH_MS: u64 = 1000;

fn sha(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

fn keys() -> [(&'static str, String); 3] {
    ["acme", "probe", "tiny"].map(|t| (t, format!("sk-console-{t}-0123456789abcdefghij")))
}

/// The config over `instances`: tenants by API key, or (`jwt`) by HS256
/// tokens, with salts, limits and (`cluster`) a Redis password.
fn config(instances: &[String], cluster: bool, jwt: bool) -> String {
    let list: String = instances
        .iter()
        .map(|u| format!("      - url: \"{u}\"\n"))
        .collect();
    let api_keys: String = keys()
        .iter()
        .map(|(t, k)| format!("    - {{ tenant: {t}, sha256: \"{}\" }}\n", sha(k)))
        .collect();
    // A Redis nobody listens on: limits fall back to this replica's share.
    let cluster = if cluster {
        format!(
            "cluster:\n  redis: \"redis://127.0.0.1:9/\"\n  password: \"{REDIS_PASSWORD}\"\n  timeout_ms: 20\n"
        )
    } else {
        String::new()
    };
    let auth = if jwt {
        format!(
            "auth:\n  mode: jwt\n  jwt: {{ algorithms: [HS256], secret: \"{HS_SECRET}\", issuer: \"https://issuer.test\", audience: kvgate }}\n"
        )
    } else {
        format!("auth:\n  mode: api_key\n  api_keys:\n{api_keys}")
    };
    format!(
        r#"server:
  listen: "127.0.0.1:0"
endpoints:
  - name: chat
    models: ["{MODEL}"]
    instances:
{list}    routing:
      strategy: longest_prefix
      cache_tokens: 100000
    health:
      path: /health
      interval_ms: {HEALTH_MS}
      unhealthy_threshold: 1
{auth}tenants:
  overrides:
    tiny: {{ requests_per_minute: 2 }}
    acme: {{ max_concurrency: 8 }}
isolation:
  upstream_cache_salt: true
  salt_secret: "{SALT_SECRET}"
{cluster}"#
    )
}

const MODEL: &str = "meta-llama/Llama-3.1-70B-Instruct";

/// Every secret of [`config`], and the derived values that must not leak either.
fn secrets() -> Vec<String> {
    let mut s = vec![
        HS_SECRET.to_owned(),
        SALT_SECRET.to_owned(),
        REDIS_PASSWORD.to_owned(),
        ADMIN_TOKEN.to_owned(),
    ];
    for (tenant, key) in keys() {
        s.push(sha(&key));
        s.push(key);
        s.push(kvgate::tenancy::salt::for_tenant(
            &kvgate::config::Secret::new(SALT_SECRET),
            tenant,
        ));
    }
    s
}

async fn sims(n: usize) -> Vec<kvgate_sim::SimHandle> {
    let cfg = kvgate_sim::SimConfig {
        time_scale: 0.05,
        ..kvgate_sim::SimConfig::llama70b_h100_tp4()
    };
    kvgate_sim::spawn_fleet(&cfg, n).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_in_a_real_browser() {
    let mut fleet = sims(3).await;
    let urls: Vec<String> = fleet.iter().map(|h| h.url()).collect();
    let gw = Gateway::start(&config(&urls, true, false)).await;
    let shots = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/console");
    std::fs::create_dir_all(shots).unwrap();
    let kill = urls[2].clone();
    let settings = serde_json::json!({
        "url": gw.url(""),
        "admin_token": ADMIN_TOKEN,
        "model": MODEL,
        "system": "You are the console test's assistant. ".repeat(40),
        "keys": keys().into_iter().collect::<std::collections::HashMap<_, _>>(),
        "instances": urls,
        "kill": kill,
        "health_ms": HEALTH_MS,
        "unhealthy_threshold": 1,
        "shots": shots,
        "secrets": secrets(),
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/console_browser.py");
    let mut child = tokio::process::Command::new("python3")
        .arg(script)
        .env("KVGATE_CONSOLE", settings.to_string())
        .env("NO_PROXY", "*")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 must be installed (pip install -r tests/sdk/requirements.txt)");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let mut out = String::new();
    let run = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "KILL" {
                let victim = fleet.remove(2);
                assert_eq!(victim.url(), kill);
                // Its listener closes at once; it is not waited for.
                tokio::spawn(victim.shutdown());
                stdin.write_all(b"killed\n").await.unwrap();
            } else {
                out.push_str(&line);
                out.push('\n');
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the browser test took over 3 minutes");
    let status = child.wait().await.unwrap();
    let mut err = String::new();
    stderr.read_to_string(&mut err).await.unwrap();
    assert!(
        status.success() && out.starts_with("ok"),
        "console_browser.py failed (apt-get install chromium chromium-driver; pip install -r tests/sdk/requirements.txt)\nstdout:\n{out}\nstderr:\n{err}"
    );
    eprintln!("console_browser.py: {out}");
    for shot in [
        "console-1440x900.png",
        "console-explain-1440x900.png",
        "console-phone-390.png",
    ] {
        let bytes = std::fs::read(format!("{shots}/{shot}")).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{shot} is not a PNG");
    }
}

#[tokio::test]
async fn the_console_is_off_without_an_admin_token_and_redacts_the_config() {
    let fleet = sims(1).await;
    let urls: Vec<String> = fleet.iter().map(|h| h.url()).collect();
    let yaml = config(&urls, true, true);
    // `with_admin` leaves a config with its own `admin:` section alone.
    let off = Gateway::start(&format!("{yaml}admin: {{}}\n")).await;
    for path in ["/console", "/console/api/state", "/console/api/events"] {
        let r = client().get(off.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 403, "{path} with admin routes off");
        let r = client()
            .get(off.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            403,
            "{path} with admin routes off, a token sent"
        );
    }
    let r = client()
        .post(off.url("/console/login"))
        .body(format!("token={ADMIN_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    let on = Gateway::start(&yaml).await;
    let r = client()
        .get(on.url("/console/api/config"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    let text = v["text"].as_str().unwrap();
    assert!(
        text.contains("Secret(..)"),
        "the salt secret is shown redacted"
    );
    assert!(text.contains("AdminToken(..)"));
    for s in secrets() {
        assert!(
            !text.contains(&s),
            "a secret in the config view: {}…",
            &s[..6]
        );
    }
    assert_eq!(v["reload"]["by"], "start");
    // A reload is noted, with what asked for it.
    let dir = std::env::temp_dir().join(format!("kvgate-console-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.yaml");
    std::fs::write(&path, with_admin(&yaml)).unwrap();
    kvgate::fleet::reload::reload_from(&path, &on.state).unwrap();
    let r = client()
        .get(on.url("/console/api/state"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["reload"]["by"], "file");
    assert_eq!(v["reload"]["count"], 1);
    // Every console answer, the event stream's first seconds included, is
    // free of the JWT secret, the salt secret and the Redis password.
    let mut bodies = Vec::new();
    for path in [
        "/console",
        "/console/api/state",
        "/console/api/config",
        "/console/assets/console.js",
    ] {
        let r = client()
            .get(on.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        bodies.push(String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned());
    }
    let mut events = client()
        .get(on.url("/console/api/events"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let mut stream = String::new();
    let _ = tokio::time::timeout(Duration::from_millis(2500), async {
        while let Ok(Some(chunk)) = events.chunk().await {
            stream.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(
        stream.contains("event: hello") && stream.contains("event: state"),
        "{stream}"
    );
    bodies.push(stream);
    for body in &bodies {
        for s in secrets() {
            assert!(
                !body.contains(&s),
                "a secret in a console answer: {}…",
                &s[..6]
            );
        }
    }
    // A viewer does not hold up a graceful shutdown: its stream ends.
    let mut on = on;
    let mut events = client()
        .get(on.url("/console/api/events"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(events.chunk().await.unwrap().is_some(), "the hello event");
    on.shutdown();
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        while let Ok(Some(_)) = events.chunk().await {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the event stream outlived the shutdown by 3 s"
    );
}
