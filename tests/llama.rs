//! A real model behind kvgate, no GPU: two llama.cpp `llama-server` instances
//! serving SmolLM2-135M on 127.0.0.1, the real gateway in front, and the
//! official OpenAI Python SDK streaming through it. A repeated long prefix
//! must come back with `usage.prompt_tokens_details.cached_tokens` > 0 — the
//! server's own prompt cache, reached because kvgate sent the repeat to the
//! instance that had seen the prefix.
//!
//! The binary and the model come from `scripts/llama-server.sh` (built once
//! into a cache outside the clone), named by `KVGATE_LLAMA_SERVER` and
//! `KVGATE_LLAMA_MODEL`; `.ci/run` sets both. Without them the test fails,
//! unless `KVGATE_SKIP_LLAMA=1` opts out explicitly.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Gateway;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

const MODEL: &str = "smollm2";

/// The paths from the environment; `None` only when explicitly skipped.
fn llama_paths() -> Option<(PathBuf, PathBuf)> {
    let server = std::env::var_os("KVGATE_LLAMA_SERVER");
    let model = std::env::var_os("KVGATE_LLAMA_MODEL");
    let (Some(server), Some(model)) = (server, model) else {
        if std::env::var("KVGATE_SKIP_LLAMA").as_deref() == Ok("1") {
            eprintln!("KVGATE_SKIP_LLAMA=1: skipping the llama.cpp integration test");
            return None;
        }
        panic!(
            "KVGATE_LLAMA_SERVER and KVGATE_LLAMA_MODEL are not set. Build llama-server and \
             fetch the model once (minutes; cached under ~/.cache/kvgate) with\n    \
             eval \"$(scripts/llama-server.sh)\"\nthen rerun; or set KVGATE_SKIP_LLAMA=1 to skip \
             this test deliberately."
        );
    };
    let (server, model) = (PathBuf::from(server), PathBuf::from(model));
    assert!(
        server.is_file(),
        "KVGATE_LLAMA_SERVER={} is not a file: rerun scripts/llama-server.sh",
        server.display()
    );
    assert!(
        model.is_file(),
        "KVGATE_LLAMA_MODEL={} is not a file: rerun scripts/llama-server.sh",
        model.display()
    );
    Some((server, model))
}

/// One llama-server child; killed when dropped (also when a test panics).
struct LlamaServer {
    port: u16,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl LlamaServer {
    /// Start on a free port and wait until `/health` answers 200.
    async fn start(server: &Path, model: &Path) -> Self {
        let mut last = String::new();
        // A port found free can be taken before the server binds it: retry.
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new(server)
                .args(["-m"])
                .arg(model)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                // One thread each: instances share the machine's cores.
                .args(["-t", "1", "-tb", "1"])
                // Two slots of 4,096 tokens; no RAM prompt cache, so a miss
                // is a miss (the slots' KV is the cache that counts).
                .args(["-np", "2", "-c", "8192", "--cache-ram", "0"])
                // No extra CPU buffer types: on AMX CPUs inside sandboxes that
                // do not grant AMX state, llama.cpp's AMX kernels segfault at load.
                .arg("--no-repack")
                .args(["--no-webui", "--metrics", "-a", MODEL])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", server.display()));
            let log = Arc::new(Mutex::new(Vec::new()));
            for pipe in [
                child.stdout.take().map(|p| Box::new(p) as Box<_>),
                child.stderr.take().map(|p| Box::new(p) as Box<_>),
            ]
            .into_iter()
            .flatten()
            {
                let pipe: Box<dyn tokio::io::AsyncRead + Send + Unpin> = pipe;
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(pipe).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        log.lock().unwrap().push(line);
                    }
                });
            }
            let mut me = Self { port, child, log };
            if me.wait_healthy().await {
                return me;
            }
            last = me.log_tail();
        }
        panic!("llama-server did not become healthy (three tries); last log:\n{last}");
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn wait_healthy(&mut self) -> bool {
        let client = common::client();
        let deadline = Instant::now() + Duration::from_secs(180);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(r) = client.get(format!("{}/health", self.url())).send().await
                && r.status() == 200
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(40)..].join("\n")
    }

    /// Prompt tokens this server has seen, computed or taken from its cache.
    async fn prompt_tokens_seen(&self) -> f64 {
        let text = common::client()
            .get(format!("{}/metrics", self.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with("llamacpp:prompt_tokens_total ")
                    || l.starts_with("llamacpp:prompt_tokens_cached_total ")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .sum()
    }
}

fn gateway_yaml(servers: &[&LlamaServer]) -> String {
    let instances: String = servers
        .iter()
        .map(|s| format!("      - url: \"{}\"\n", s.url()))
        .collect();
    format!(
        r#"server:
  listen: "127.0.0.1:0"
  failover_cooldown_ms: 60000
endpoints:
  - name: llama
    models: ["{MODEL}"]
    instances:
{instances}    routing:
      strategy: prefix_aware
      prefix_length: 1024
      concurrency_threshold: 4
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_streams_through_kvgate_from_llama_server_with_cached_tokens() {
    let Some((server, model)) = llama_paths() else {
        return;
    };
    let (a, b) = tokio::join!(
        LlamaServer::start(&server, &model),
        LlamaServer::start(&server, &model)
    );
    let gateway = Gateway::start(&gateway_yaml(&[&a, &b])).await;

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/llama_interop.py");
    let base = format!("http://{}", gateway.addr);
    let run = Command::new("python3")
        .args([script, &base, MODEL])
        .env("NO_PROXY", "*")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("the SDK script ran for over 10 minutes")
        .expect("python3 must be installed (.ci/run installs the SDK: pip install -r tests/sdk/requirements.txt)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "llama.cpp SDK interop failed\nstdout:\n{stdout}\nstderr:\n{stderr}\n\
         llama-server A log tail:\n{}\nllama-server B log tail:\n{}",
        a.log_tail(),
        b.log_tail()
    );
    let line = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["warm"]["cached_tokens"].as_u64().unwrap() > 0, "{v}");
    eprintln!("llama.cpp through kvgate: {v}");

    // Prefix-aware routing: all three requests shared a prefix, so exactly one
    // instance saw them; the other is still cold.
    let seen = [a.prompt_tokens_seen().await, b.prompt_tokens_seen().await];
    assert_eq!(
        seen.iter().filter(|&&n| n > 0.0).count(),
        1,
        "one prefix should reach one instance; prompt tokens seen: {seen:?}"
    );
}
