//! Interop with the libraries vLLM publishes with: a publisher on real libzmq
//! (pyzmq) encoding with msgspec (`tests/sdk/vllm_kv_publisher.py`), in both
//! encodings. The gateway's pure-Rust ZeroMQ subscriber and replay client must
//! follow it: stored blocks attract traffic, a gap is refilled by replay.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::cache_aware::{at, explain};
use super::kv_aware::tokenizer_path;
use crate::common::*;

struct PyPublisher {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    events: String,
    replay: String,
}

impl PyPublisher {
    async fn start(encoding: &str) -> Self {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/sdk/vllm_kv_publisher.py"
        );
        let mut child = tokio::process::Command::new("python3")
            .args([script, encoding])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 (.ci/run installs pyzmq and msgspec: pip install -r tests/sdk/requirements.txt)");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = stdout.next_line().await.unwrap().unwrap_or_else(|| {
            panic!("the publisher exited: are pyzmq and msgspec installed? pip install -r tests/sdk/requirements.txt")
        });
        let v: Value = serde_json::from_str(&first).unwrap();
        Self {
            _child: child,
            stdin,
            stdout,
            events: v["events"].as_str().unwrap().to_owned(),
            replay: v["replay"].as_str().unwrap().to_owned(),
        }
    }

    async fn cmd(&mut self, c: Value) {
        self.stdin
            .write_all(format!("{c}\n").as_bytes())
            .await
            .unwrap();
        let ack = self.stdout.next_line().await.unwrap().unwrap();
        assert!(ack.starts_with("ok "), "{ack}");
    }
}

fn store(first: u64, tokens: &[u32]) -> Value {
    let n = tokens.len() / 16;
    json!({"store": {"hashes": (first..first + n as u64).collect::<Vec<_>>(), "parent": null,
        "tokens": &tokens[..n * 16], "block_size": 16}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_libzmq_msgspec_publisher_is_followed_in_both_encodings_with_replay() {
    for enc in ["array", "map"] {
        let ups = [
            Upstream::start("u0", Mode::Json).await,
            Upstream::start("u1", Mode::Json).await,
        ];
        let mut py = PyPublisher::start(enc).await;
        let yaml = format!(
            "endpoints:\n  - name: kv\n    models: [\"m\"]\n    instances:\n      - {{ id: u0, url: \"{}\" }}\n      - {{ id: u1, url: \"{}\", kv_events: \"{}\", kv_replay: \"{}\" }}\n    routing:\n      strategy: kv_aware\n      tokenizer: \"{}\"\n",
            ups[0].url(),
            ups[1].url(),
            py.events,
            py.replay,
            tokenizer_path()
        );
        let gw = Gateway::start(&yaml).await;
        let rt = gw.state.runtime.load_full();
        let feed = rt.endpoint("kv").unwrap().instances[1].kv_feed().unwrap();
        let batches = || {
            feed.feed
                .counters
                .batches
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        for round in 0.. {
            py.cmd(json!({"empty": true})).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            if batches() > 0 {
                break;
            }
            assert!(round < 500, "{enc}: never heard the libzmq publisher");
        }
        let tok = kvgate_tokenize::PromptTokenizer::load(&tokenizer_path(), None).unwrap();
        let body = |topic: &str| {
            json!({"model": "m", "messages": [
                {"role": "system", "content": format!("Reference manual for {topic}. ").repeat(60)},
                {"role": "user", "content": "Summarise."}]})
        };
        let wait_for = |b: Value| {
            let gw = &gw;
            async move {
                for _ in 0..500 {
                    let e = explain(gw, None, &b).await;
                    if e["chosen"] == "u1" && e["reason"] == "cache_hit" {
                        return e;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                panic!("{enc}: never routed to u1: {}", explain(gw, None, &b).await);
            }
        };
        let a = body("turbines");
        py.cmd(store(100, &tok.chat(&a, usize::MAX).unwrap().ids))
            .await;
        let e = wait_for(a).await;
        assert_eq!(at(&e, "u1")["source"], "events");
        // A batch lost on the way, then the next one: the replay socket refills it.
        let b = body("compressors");
        py.cmd(json!({"skip": store(500, &tok.chat(&b, usize::MAX).unwrap().ids)}))
            .await;
        py.cmd(json!({"empty": true})).await;
        let e = wait_for(b).await;
        assert_eq!(at(&e, "u1")["kv_events"]["gaps"], 1, "{enc}");
        assert_eq!(at(&e, "u1")["kv_events"]["dropped"], 0, "{enc}");
    }
}
