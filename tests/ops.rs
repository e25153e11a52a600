//! Running it: active health checks and /ready, reload while traffic flows,
//! graceful shutdown, routing explained, metrics (more in `ops/metrics.rs`),
//! `https://` instances (`ops/tls.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

mod common;
#[path = "ops/deploy.rs"]
mod deploy;
/// DNS discovery against dnsmasq.
#[path = "ops/discovery.rs"]
mod discovery;
#[path = "ops/drain.rs"]
mod drain;
#[path = "ops/kubernetes.rs"]
mod kubernetes;
#[path = "ops/metrics.rs"]
mod metrics;
#[path = "ops/tls.rs"]
mod tls;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

const MODEL: &str = "test-model";

fn with_health(yaml: String) -> String {
    format!(
        "{yaml}    health:\n      path: /health\n      interval_ms: 100\n      timeout_ms: 1000\n      healthy_threshold: 1\n      unhealthy_threshold: 2\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_health_checks_eject_and_recover_and_ready_follows() {
    let a = Upstream::start("a", Mode::Json).await;
    let b = Upstream::start("b", Mode::Json).await;
    let gw = Gateway::start(&with_health(config(MODEL, &[&a, &b], "prefix_aware", 10))).await;
    let ready = || async {
        client()
            .get(gw.url("/ready"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let rt = gw.state.runtime.load_full();
    let ep = rt.endpoint("chat").unwrap().clone();
    // Ready once a probe has confirmed an instance.
    eventually("first probe", || ep.instances.iter().any(|i| i.confirmed())).await;
    assert_eq!(ready().await, 200);

    a.set_mode(Mode::Status(503));
    eventually("a marked unhealthy", || !ep.instances[0].is_healthy()).await;
    // Traffic goes to b only; nothing fails.
    for p in 0..10 {
        let r = gw
            .chat(&chat_body(MODEL, &system_prompt(p), "q", false))
            .await;
        assert_eq!(r.status(), 200);
        assert_eq!(served_by(&r), "b");
    }
    assert_eq!(ready().await, 200, "one healthy instance is enough");
    b.set_mode(Mode::Status(500));
    eventually("b marked unhealthy", || !ep.instances[1].is_healthy()).await;
    assert_eq!(ready().await, 503);
    a.set_mode(Mode::Json);
    eventually("a back", || ep.instances[0].is_healthy()).await;
    assert_eq!(ready().await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_traffic_loses_nothing_and_moves_only_the_new_share() {
    let ups: Vec<Upstream> = {
        let mut v = Vec::new();
        for i in 0..4 {
            v.push(Upstream::start(&format!("u{i}"), Mode::Delay(Duration::from_millis(20))).await);
        }
        v
    };
    let three: Vec<&Upstream> = ups[..3].iter().collect();
    let four: Vec<&Upstream> = ups.iter().collect();
    let gw = Gateway::start(&config(MODEL, &three, "prefix_aware", 64)).await;
    let url = gw.url("/v1/chat/completions");
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..6 {
        let (url, stop, failures, done) =
            (url.clone(), stop.clone(), failures.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let body = serde_json::to_vec(&chat_body(
                    MODEL,
                    &system_prompt(w * 1000 + i % 50),
                    "q",
                    false,
                ))
                .unwrap();
                match client().post(&url).body(body).send().await {
                    Ok(r) if r.status() == 200 => {}
                    _ => {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        }));
    }
    let place = |gw: &Gateway| {
        let rt = gw.state.runtime.load_full();
        let ep = rt.endpoint("chat").unwrap().clone();
        (0..200u64)
            .map(|k| {
                let plan = ep.policy.plan(
                    &kvgate_routing::Request::with_key(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                    &vec![kvgate_routing::Load::with_in_flight(0); ep.instances.len()],
                );
                ep.instances[plan.order[0]].id.clone()
            })
            .collect::<Vec<_>>()
    };
    eventually("traffic flowing", || done.load(Ordering::SeqCst) > 30).await;
    let before = place(&gw);
    gw.state
        .reload(kvgate::Config::from_yaml(&config(MODEL, &four, "prefix_aware", 64)).unwrap())
        .unwrap();
    let n = done.load(Ordering::SeqCst);
    eventually("traffic after adding", || {
        done.load(Ordering::SeqCst) > n + 30
    })
    .await;
    let after = place(&gw);
    let new_id = ups[3].url();
    let mut moved = 0;
    for (b, a) in before.iter().zip(&after) {
        if b != a {
            assert_eq!(a, &new_id, "a key moved between old instances");
            moved += 1;
        }
    }
    assert!(moved > 0 && moved < 120, "moved {moved} of 200");
    // Remove u0 while its requests are in flight.
    let rest: Vec<&Upstream> = ups[1..].iter().collect();
    gw.state
        .reload(kvgate::Config::from_yaml(&config(MODEL, &rest, "prefix_aware", 64)).unwrap())
        .unwrap();
    let n = done.load(Ordering::SeqCst);
    eventually("traffic after removing", || {
        done.load(Ordering::SeqCst) > n + 30
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "requests failed during reloads"
    );
    assert!(ups[3].hits() > 0, "the added instance took no traffic");
    // In-flight counts carried over and drained.
    let rt = gw.state.runtime.load_full();
    let ep = rt.endpoint("chat").unwrap().clone();
    eventually("drained", || {
        ep.instances.iter().all(|i| i.in_flight() == 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_file_keeps_the_running_config() {
    let a = Upstream::start("a", Mode::Json).await;
    let b = Upstream::start("b", Mode::Json).await;
    let yaml = config(MODEL, &[&a], "prefix_aware", 10);
    let gw = Gateway::start(&yaml).await;
    let dir = std::env::temp_dir().join(format!("kvgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.yaml");
    std::fs::write(
        &path,
        yaml.replace("concurrency_threshold: 10", "concurrency_threshold: 0"),
    )
    .unwrap();
    let err = kvgate::fleet::reload::reload_from(&path, &gw.state).unwrap_err();
    assert!(err.contains("concurrency_threshold"), "{err}");
    assert_eq!(gw.state.runtime.load().endpoints[0].instances.len(), 1);
    std::fs::write(&path, config(MODEL, &[&a, &b], "prefix_aware", 10)).unwrap();
    kvgate::fleet::reload::reload_from(&path, &gw.state).unwrap();
    assert_eq!(gw.state.runtime.load().endpoints[0].instances.len(), 2);
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("kvgate_config_reloads_total{result=\"error\"}"),
        "{metrics}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let up = Upstream::start("u", Mode::Delay(Duration::from_millis(800))).await;
    let mut gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let url = gw.url("/v1/chat/completions");
    let t = tokio::spawn(async move {
        client()
            .post(url)
            .body(serde_json::to_vec(&chat_body(MODEL, "s", "q", false)).unwrap())
            .send()
            .await
            .unwrap()
            .status()
    });
    eventually("request in flight", || up.hits() == 1).await;
    gw.shutdown();
    assert_eq!(t.await.unwrap(), 200);
    let served = tokio::time::timeout(Duration::from_secs(20), &mut gw.task)
        .await
        .unwrap()
        .unwrap();
    assert!(served.is_ok());
    assert!(
        client().get(gw.url("/health")).send().await.is_err(),
        "still accepting after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_route_reports_window_key_and_choice() {
    let ups = [
        Upstream::start("a", Mode::Json).await,
        Upstream::start("b", Mode::Json).await,
    ];
    let gw = Gateway::start(&config(MODEL, &[&ups[0], &ups[1]], "prefix_aware", 10)).await;
    let json = chat_body(MODEL, &system_prompt(3), "q", false);
    let body = serde_json::to_vec(&json).unwrap();
    let v: serde_json::Value = gw
        .explain("/v1/chat/completions", None, &json)
        .await
        .json_value()
        .await;
    assert_eq!(v["api"], "chat");
    assert_eq!(v["window"]["length"], 1024);
    assert_eq!(v["reason"], "affinity");
    assert!(
        v["window"]["starts_with"]
            .as_str()
            .unwrap()
            .starts_with("system")
    );
    // The explained choice is where the request really goes.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .body(body)
        .send()
        .await
        .unwrap();
    let chosen = v["chosen"].as_str().unwrap();
    let by_name: HashMap<String, String> = ups
        .iter()
        .map(|u| (u.url(), u.state.name.clone()))
        .collect();
    assert_eq!(by_name[chosen], served_by(&r));
    assert_eq!(ups[0].hits() + ups[1].hits(), 1, "explain must not forward");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_decisions_and_cached_tokens() {
    let up = Upstream::start("u", Mode::Json).await;
    let yaml = config(MODEL, &[&up], "prefix_aware", 10).replace("name: chat", "name: metricsep");
    let gw = Gateway::start(&yaml).await;
    for _ in 0..3 {
        gw.chat(&chat_body(MODEL, "s", "q", false))
            .await
            .bytes()
            .await
            .unwrap();
    }
    let text = gw.metrics().await;
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    assert!(
        line("kvgate_requests_total{endpoint=\"metricsep\",api=\"chat\",status=\"2xx\"}")
            .ends_with(" 3"),
        "{text}"
    );
    // Series of every upstream exist from start-up at zero: add them up.
    let decisions: f64 = text
        .lines()
        .filter(|l| l.starts_with("kvgate_routing_decisions_total{endpoint=\"metricsep\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(decisions, 3.0, "{text}");
    // The test upstream reports 8 cached of 10 prompt tokens per request.
    assert!(
        line("kvgate_upstream_cached_tokens_total{endpoint=\"metricsep\"").ends_with(" 24"),
        "{text}"
    );
    assert!(
        line("kvgate_upstream_prompt_tokens_total{endpoint=\"metricsep\"").ends_with(" 30"),
        "{text}"
    );
    assert!(text.contains("kvgate_routing_decision_seconds_bucket"));
    // Durations are recorded when each body has ended.
    assert!(
        line("kvgate_request_duration_seconds_count{endpoint=\"metricsep\",api=\"chat\"}")
            .ends_with(" 3"),
        "{text}"
    );
}

trait JsonValue {
    async fn json_value(self) -> serde_json::Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> serde_json::Value {
        serde_json::from_slice(&self.bytes().await.unwrap()).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_the_config_file_reloads_it() {
    let a = Upstream::start("a", Mode::Json).await;
    let b = Upstream::start("b", Mode::Json).await;
    let yaml = config(MODEL, &[&a], "prefix_aware", 10);
    let gw = Gateway::start(&yaml).await;
    let dir = std::env::temp_dir().join(format!("kvgate-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let watcher = tokio::spawn(kvgate::fleet::reload::watch(
        path.clone(),
        Arc::clone(&gw.state),
    ));
    // The watcher may need a moment to register; rewrite until the change lands.
    let two = config(MODEL, &[&a, &b], "prefix_aware", 10);
    for _ in 0..100 {
        std::fs::write(&path, &two).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        if gw.state.runtime.load().endpoints[0].instances.len() == 2 {
            break;
        }
    }
    assert_eq!(
        gw.state.runtime.load().endpoints[0].instances.len(),
        2,
        "file change not picked up"
    );
    watcher.abort();
    std::fs::remove_dir_all(&dir).ok();
}

/// A Kubernetes ConfigMap volume: `kvgate.yaml -> ..data/kvgate.yaml`, and an
/// update swaps `..data` to a new timestamped directory by rename. No event
/// names `kvgate.yaml`, yet the change must land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_style_symlink_swap_reloads() {
    use std::os::unix::fs::symlink;
    let a = Upstream::start("a", Mode::Json).await;
    let b = Upstream::start("b", Mode::Json).await;
    let yaml = config(MODEL, &[&a], "prefix_aware", 10);
    let gw = Gateway::start(&yaml).await;
    let dir = std::env::temp_dir().join(format!("kvgate-configmap-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(dir.join("..2026_12_01_first")).unwrap();
    std::fs::write(dir.join("..2026_12_01_first/kvgate.yaml"), &yaml).unwrap();
    symlink("..2026_12_01_first", dir.join("..data")).unwrap();
    symlink("..data/kvgate.yaml", dir.join("kvgate.yaml")).unwrap();
    let watcher = tokio::spawn(kvgate::fleet::reload::watch(
        dir.join("kvgate.yaml"),
        Arc::clone(&gw.state),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // What the kubelet does: write the new version beside the old, point a
    // temporary link at it, rename the link over `..data`, drop the old one.
    let two = config(MODEL, &[&a, &b], "prefix_aware", 10);
    std::fs::create_dir_all(dir.join("..2026_12_01_second")).unwrap();
    std::fs::write(dir.join("..2026_12_01_second/kvgate.yaml"), &two).unwrap();
    symlink("..2026_12_01_second", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..2026_12_01_first")).unwrap();

    eventually("the swapped ConfigMap is loaded", || {
        gw.state.runtime.load().endpoints[0].instances.len() == 2
    })
    .await;
    let resp = gw
        .chat(&chat_body(MODEL, &system_prompt(1), "q", false))
        .await;
    assert_eq!(resp.status(), 200);
    watcher.abort();
    std::fs::remove_dir_all(&dir).ok();
}

/// Secrets from the environment: `check` (and so `serve`) reads the variable
/// at load, and a missing one is an error that names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_come_from_the_environment() {
    let dir = std::env::temp_dir().join(format!("kvgate-env-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.yaml");
    let yaml = config(MODEL, &[], "prefix_aware", 10).replace(
        "    instances:\n",
        "    instances: [{ url: \"http://127.0.0.1:9\" }]\n    upstream_api_key: { env: KVGATE_TEST_UPSTREAM_KEY }\n",
    ) + "auth:\n  mode: jwt\n  jwt:\n    algorithms: [HS256]\n    secret: { env: KVGATE_TEST_JWT_SECRET }\n    issuer: i\n    audience: a\nisolation:\n  salt_secret: { env: KVGATE_TEST_SALT }\n";
    std::fs::write(&path, yaml).unwrap();
    let bin = env!("CARGO_BIN_EXE_kvgate");
    let check = |vars: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["check", "--config"]).arg(&path);
        cmd.env_remove("KVGATE_TEST_JWT_SECRET")
            .env_remove("KVGATE_TEST_UPSTREAM_KEY")
            .env(
                "KVGATE_TEST_SALT",
                "a-salt-secret-from-the-environment-0123",
            );
        cmd.envs(vars.iter().copied());
        cmd.output().unwrap()
    };
    let out = check(&[
        (
            "KVGATE_TEST_JWT_SECRET",
            "an-hs256-secret-from-the-environment-0123",
        ),
        ("KVGATE_TEST_UPSTREAM_KEY", "sk-upstream"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = check(&[("KVGATE_TEST_UPSTREAM_KEY", "sk-upstream")]);
    assert!(
        !out.status.success(),
        "accepted a config whose secret is not set"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KVGATE_TEST_JWT_SECRET"), "{err}");
    // A short secret from the environment is refused like an inline one.
    let out = check(&[
        ("KVGATE_TEST_JWT_SECRET", "short"),
        ("KVGATE_TEST_UPSTREAM_KEY", "sk-upstream"),
    ]);
    assert!(!out.status.success(), "accepted a 5-byte HS256 secret");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_the_example_placeholder_secrets_and_check_warns() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml");
    let bin = env!("CARGO_BIN_EXE_kvgate");
    let out = tokio::process::Command::new(bin)
        .args(["serve", "--config", example, "--listen", "127.0.0.1:0"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "served with the example's secrets");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("placeholder secret"), "{err}");
    let out = tokio::process::Command::new(bin)
        .args(["check", "--config", example])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("warning:") && text.contains("placeholder"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_process_lists_every_instance_and_describes_every_family() {
    use tokio::io::AsyncBufReadExt;
    let dir = std::env::temp_dir().join(format!("kvgate-fresh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.yaml");
    std::fs::write(
        &path,
        "endpoints:\n  - name: fresh\n    models: [m]\n    instances:\n      - { id: a, url: \"http://127.0.0.1:9\" }\n      - { id: b, url: \"http://127.0.0.1:10\" }\n",
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next_line().await.unwrap().expect("kvgate exited");
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let text = client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for id in ["a", "b"] {
        let series = format!("kvgate_instance_healthy{{endpoint=\"fresh\",upstream=\"{id}\"}} 1");
        assert!(text.contains(&series), "{series} missing:\n{text}");
        assert!(text.contains(&format!(
            "kvgate_instance_in_flight{{endpoint=\"fresh\",upstream=\"{id}\"}} 0"
        )));
    }
    for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = family.split_whitespace().next().unwrap();
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP for {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_drops_health_checks_brings_probed_out_instances_back() {
    let a = Upstream::start("a", Mode::Json).await;
    let b = Upstream::start("b", Mode::Json).await;
    let plain = config(MODEL, &[&a, &b], "prefix_aware", 10);
    let gw = Gateway::start(&with_health(plain.clone())).await;
    let rt = gw.state.runtime.load_full();
    let inst = rt.endpoint("chat").unwrap().instances[0].clone();
    a.set_mode(Mode::Status(503));
    eventually("a marked unhealthy", || !inst.is_healthy()).await;
    // The probe's complaint is fixed and the checks are switched off.
    a.set_mode(Mode::Json);
    gw.state
        .reload(kvgate::Config::from_yaml(&plain).unwrap())
        .unwrap();
    assert!(
        inst.is_healthy(),
        "stays out for good with no probe to bring it back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_sagemaker_prints_an_endpoint_that_check_accepts() {
    let bin = env!("CARGO_BIN_EXE_kvgate");
    let json = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/sagemaker/endpoint-config.json"
    );
    let out = tokio::process::Command::new(bin)
        .args([
            "import-sagemaker",
            json,
            "--instance",
            "http://10.0.0.11:8000",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(
        yaml.contains("PREFIX_AWARE") && yaml.contains("prefix_length: 4096"),
        "{yaml}"
    );
    let dir = std::env::temp_dir().join(format!("kvgate-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("imported.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let check = tokio::process::Command::new(bin)
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    std::fs::remove_dir_all(&dir).ok();
    // A file that is not an endpoint config is refused, saying why.
    let out = tokio::process::Command::new(bin)
        .args([
            "import-sagemaker",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a SageMaker endpoint config"));
}

/// A real `kvgate serve` process with `extra` appended to the `server:`
/// section, one chat request through it, and everything it logged.
async fn logs_of_one_request(extra: &str) -> String {
    use tokio::io::AsyncBufReadExt;
    let up = Upstream::start("a", Mode::Json).await;
    let dir = std::env::temp_dir().join(format!(
        "kvgate-access-{}-{}",
        std::process::id(),
        extra.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.yaml");
    let yaml = config(MODEL, &[&up], "prefix_aware", 10)
        .replace("server:\n", &format!("server:\n{extra}"));
    std::fs::write(&path, yaml).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut logged = String::new();
    let addr = loop {
        let line = lines.next_line().await.unwrap().expect("kvgate exited");
        logged.push_str(&line);
        logged.push('\n');
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let resp = client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-request-id", "req-access-log-1")
        .header("content-type", "application/json")
        .body(chat_body(MODEL, "You are terse.", "Hi?", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    // The line is written before the answer leaves; stop and read what is left.
    child.start_kill().unwrap();
    while let Ok(Some(line)) = lines.next_line().await {
        logged.push_str(&line);
        logged.push('\n');
    }
    std::fs::remove_dir_all(&dir).ok();
    logged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_is_off_by_default_and_one_line_a_request_when_on() {
    let quiet = logs_of_one_request("").await;
    assert!(
        !quiet.contains("routed"),
        "a line per request by default:\n{quiet}"
    );
    let on = logs_of_one_request("  access_log: true\n").await;
    let line = on
        .lines()
        .find(|l| l.contains("routed"))
        .unwrap_or_else(|| panic!("no access line:\n{on}"));
    for field in [
        "kvgate::access",
        "req-access-log-1",
        "tenant=anonymous",
        "chat",
        "reason=",
        "status=200",
        "headers_ms=",
    ] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_redirect_is_relayed_to_the_client_not_followed() {
    use axum::routing::{any, post};
    let followed = Arc::new(AtomicUsize::new(0));
    let hits = Arc::clone(&followed);
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async {
                (
                    axum::http::StatusCode::TEMPORARY_REDIRECT,
                    [("location", "/elsewhere")],
                    "moved",
                )
            }),
        )
        .route(
            "/elsewhere",
            any(move || {
                hits.fetch_add(1, Ordering::SeqCst);
                async { "followed" }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let yaml = format!(
        "endpoints:\n  - name: chat\n    models: [\"{MODEL}\"]\n    instances:\n      - url: \"http://{addr}\"\n"
    );
    let gw = Gateway::start(&yaml).await;
    let no_follow = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = no_follow
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body(MODEL, "You are terse.", "Hi?", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 307);
    assert_eq!(resp.headers()["location"], "/elsewhere");
    assert_eq!(
        followed.load(Ordering::SeqCst),
        0,
        "the gateway followed it"
    );
}
