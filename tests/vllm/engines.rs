//! The engines this binary shares: started once by `scripts/vllm.sh serve`
//! on free ports, owned by this process (`--parent`: they stop within a
//! second of it ending, whatever way it ends), and taken in turns, each turn
//! starting from emptied caches.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard, OnceCell};

use crate::common::client;

/// The served model name `scripts/vllm.sh` gives every engine.
pub const MODEL: &str = "smollm2";
/// The engines' KV block size, which the gateway's must equal.
pub const BLOCK: usize = 32;
/// Each engine's KV cache in blocks: 2,560 tokens, small enough to evict.
pub const BLOCKS: usize = 80;

/// One engine: its HTTP URL and its ZeroMQ sockets, as a gateway connects.
pub struct Engine {
    pub id: String,
    pub url: String,
    pub events: String,
    pub replay: String,
    log: PathBuf,
    /// The `serve` wrapper; replaced when the engine is restarted.
    child: std::sync::Mutex<Child>,
    /// How to start it again at the same ports: the script, its index, its
    /// HTTP, events and replay ports.
    again: (PathBuf, usize, [u16; 3]),
}

pub struct Fleet {
    pub engines: Vec<Engine>,
    /// The model folder (tokenizer.json, chat_template.jinja, weights).
    pub model: PathBuf,
}

static FLEET: OnceCell<Result<Fleet, String>> = OnceCell::const_new();
static TURN: Mutex<()> = Mutex::const_new(());

/// The shared engines, for one test at a time, caches emptied; `None` only
/// when `KVGATE_SKIP_VLLM=1`.
pub async fn take() -> Option<(MutexGuard<'static, ()>, &'static Fleet)> {
    let (script, model) = install()?;
    let turn = TURN.lock().await;
    let fleet = match FLEET.get_or_init(|| start(script, model)).await {
        Ok(f) => f,
        Err(e) => panic!("{e}"),
    };
    for e in &fleet.engines {
        e.empty_cache().await;
    }
    Some((turn, fleet))
}

/// The install from the environment; `None` only when explicitly skipped.
fn install() -> Option<(PathBuf, PathBuf)> {
    let script = std::env::var_os("KVGATE_VLLM_SCRIPT");
    let model = std::env::var_os("KVGATE_VLLM_MODEL");
    let (Some(script), Some(model)) = (script, model) else {
        if std::env::var("KVGATE_SKIP_VLLM").as_deref() == Ok("1") {
            eprintln!("KVGATE_SKIP_VLLM=1: skipping the real-vLLM tests");
            return None;
        }
        panic!(
            "KVGATE_VLLM_SCRIPT and KVGATE_VLLM_MODEL are not set. Install vLLM (CPU) and the \
             model once (minutes; cached under ~/.cache/kvgate) with\n    \
             eval \"$(scripts/vllm.sh)\"\nthen rerun; or set KVGATE_SKIP_VLLM=1 to skip these \
             tests deliberately."
        );
    };
    let (script, model) = (PathBuf::from(script), PathBuf::from(model));
    assert!(
        script.is_file(),
        "KVGATE_VLLM_SCRIPT={script:?} is not a file"
    );
    assert!(
        model.join("tokenizer.json").is_file(),
        "KVGATE_VLLM_MODEL={model:?} has no tokenizer.json: rerun scripts/vllm.sh"
    );
    Some((script, model))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start(script: PathBuf, model: PathBuf) -> Result<Fleet, String> {
    let started = Instant::now();
    let mut engines = Vec::new();
    for i in 0..2 {
        let (port, events, replay) = (free_port(), free_port(), free_port());
        let log = std::env::temp_dir().join(format!("kvgate-vllm-{}-e{i}.log", std::process::id()));
        let ports = [port, events, replay];
        let child = spawn(&script, i, ports, &log)?;
        engines.push(Engine {
            id: format!("e{i}"),
            url: format!("http://127.0.0.1:{port}"),
            events: format!("tcp://127.0.0.1:{events}"),
            replay: format!("tcp://127.0.0.1:{replay}"),
            log,
            child: std::sync::Mutex::new(child),
            again: (script.clone(), i, ports),
        });
    }
    // Both start at once (30–50 s each, one core each).
    for e in &engines {
        e.healthy().await?;
    }
    eprintln!(
        "vLLM engines up in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(Fleet { engines, model })
}

/// Run `scripts/vllm.sh serve` for engine `i` on `[http, events, replay]`,
/// its output appended to `log`.
fn spawn(
    script: &Path,
    i: usize,
    [port, events, replay]: [u16; 3],
    log: &Path,
) -> Result<Child, String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{log:?}: {e}"))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    Command::new("bash")
        .arg(script)
        .arg("serve")
        .args(["--port", &port.to_string()])
        .args(["--events-port", &events.to_string()])
        .args(["--replay-port", &replay.to_string()])
        .args(["--blocks", &BLOCKS.to_string()])
        .args(["--parent", &std::process::id().to_string()])
        .args(["--name", &format!("e{i}"), "--cpu", &i.to_string()])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot run {script:?}: {e}"))
}

impl Engine {
    /// Wait until it answers GET /health (at most 420 s).
    async fn healthy(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(420);
        let e = self;
        loop {
            if let Ok(Some(status)) = e.child.lock().unwrap().try_wait() {
                return Err(format!(
                    "engine {} exited ({status}):\n{}",
                    e.id,
                    e.log_tail()
                ));
            }
            let ok = client()
                .get(format!("{}/health", e.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ok {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "engine {} not healthy in time:\n{}",
                    e.id,
                    e.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Stop the engine as a rolling update does (SIGTERM to its `serve`
    /// wrapper, which stops the engine's process group) and wait until it
    /// is gone.
    pub async fn stop(&self) {
        let pid = self.child.lock().unwrap().id();
        let killed = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success(), "kill -TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.lock().unwrap().try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "{} did not stop in 60 s",
                self.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Start it again at the same ports (a new engine: empty cache, batches
    /// numbered from 0) and wait until it is healthy.
    pub async fn start_again(&self) {
        let (script, i, ports) = &self.again;
        let child = spawn(script, *i, *ports, &self.log).unwrap();
        *self.child.lock().unwrap() = child;
        if let Err(e) = self.healthy().await {
            panic!("{e}");
        }
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// POST a JSON body to the engine directly, behind the gateway's back.
    pub async fn post(&self, path: &str, body: &Value) -> Value {
        let (status, v) = post_json(&format!("{}{path}", self.url), None, body).await;
        assert!(status.is_success(), "{path} on {}: {status} {v}", self.id);
        v
    }

    /// Its whole `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        client()
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// One gauge or counter of its `/metrics`, summed over label sets.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Empty its prefix cache (vLLM's dev-mode `/reset_prefix_cache`, which
    /// refuses while requests run), then run one step so that the engine
    /// publishes the `AllBlocksCleared` a gateway replays.
    pub async fn empty_cache(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = client()
                .post(format!("{}/reset_prefix_cache", self.url))
                .send()
                .await
                .unwrap();
            if r.status().is_success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} would not reset its prefix cache: {}",
                self.id,
                r.status()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.post(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1}),
        )
        .await;
    }
}

/// POST `body` as JSON (with a bearer `key`): the status and the JSON answer.
pub async fn post_json(url: &str, key: Option<&str>, body: &Value) -> (reqwest::StatusCode, Value) {
    let mut req = client()
        .post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap());
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let bytes = r.bytes().await.unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

impl Fleet {
    pub fn engine(&self, id: &str) -> &Engine {
        self.engines.iter().find(|e| e.id == id).unwrap()
    }

    pub fn tokenizer(&self) -> PathBuf {
        self.model.join("tokenizer.json")
    }

    pub fn model_dir(&self) -> &Path {
        &self.model
    }
}
