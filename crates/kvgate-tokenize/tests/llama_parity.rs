//! Parity with an independent implementation: llama.cpp's `llama-server`
//! serving SmolLM2-135M, whose GGUF is where `fixtures/smollm2` came from.
//! Its `/tokenize` (llama.cpp's own BPE and pre-tokenizer regexes) must give
//! the ids `PromptTokenizer` gives, and its `/apply-template` (llama.cpp's own
//! Jinja engine) the prompts `render_chat` renders: with the model's template,
//! and with `tools_template.jinja`, a Qwen2.5-style template that exercises
//! trim_blocks/lstrip_blocks, `tojson` and tool calls.
//!
//! The binary and the model come from `scripts/llama-server.sh`, named by
//! `KVGATE_LLAMA_SERVER` and `KVGATE_LLAMA_MODEL`. Without them the test
//! fails, unless `KVGATE_SKIP_LLAMA=1` opts out explicitly.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kvgate_tokenize::PromptTokenizer;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../fixtures/smollm2/tokenizer.json"
);
const TOOLS_TEMPLATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools_template.jinja");

fn llama_paths() -> Option<(PathBuf, PathBuf)> {
    let (Some(server), Some(model)) = (
        std::env::var_os("KVGATE_LLAMA_SERVER"),
        std::env::var_os("KVGATE_LLAMA_MODEL"),
    ) else {
        if std::env::var("KVGATE_SKIP_LLAMA").as_deref() == Ok("1") {
            eprintln!("KVGATE_SKIP_LLAMA=1: skipping the llama.cpp tokenizer parity test");
            return None;
        }
        panic!(
            "KVGATE_LLAMA_SERVER and KVGATE_LLAMA_MODEL are not set. Build llama-server and fetch the \
             model once (minutes; cached under ~/.cache/kvgate) with\n    eval \"$(scripts/llama-server.sh)\"\n\
             then rerun; or set KVGATE_SKIP_LLAMA=1 to skip this test deliberately."
        );
    };
    let (server, model) = (PathBuf::from(server), PathBuf::from(model));
    assert!(
        server.is_file(),
        "KVGATE_LLAMA_SERVER={} is not a file",
        server.display()
    );
    assert!(
        model.is_file(),
        "KVGATE_LLAMA_MODEL={} is not a file",
        model.display()
    );
    Some((server, model))
}

/// One llama-server child, killed when dropped (also when the test panics).
struct Llama {
    url: String,
    _child: Child,
    client: reqwest::Client,
}

impl Llama {
    async fn start(server: &Path, model: &Path, extra: &[&str]) -> Self {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        // A port found free can be taken before the server binds it: retry.
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new(server)
                .arg("-m")
                .arg(model)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                // --no-repack: llama.cpp's AMX kernels segfault at load in sandboxes without AMX state.
                .args(["--no-repack", "-c", "2048", "-t", "1", "--no-webui"])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", server.display()));
            let url = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline && child.try_wait().ok().flatten().is_none() {
                if let Ok(r) = client.get(format!("{url}/health")).send().await
                    && r.status() == 200
                {
                    return Self {
                        url,
                        _child: child,
                        client,
                    };
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!(
            "llama-server {} did not become healthy (three tries)",
            server.display()
        );
    }

    async fn post(&self, path: &str, body: &Value) -> Value {
        let r = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert!(status.is_success(), "{path} {body}: {status} {v}");
        v
    }

    async fn tokenize(&self, text: &str, add_special: bool) -> Vec<u32> {
        let v = self
            .post(
                "/tokenize",
                &json!({"content": text, "add_special": add_special, "parse_special": true}),
            )
            .await;
        serde_json::from_value(v["tokens"].clone()).unwrap()
    }

    async fn apply_template(&self, body: &Value) -> String {
        let v = self.post("/apply-template", body).await;
        v["prompt"].as_str().unwrap().to_owned()
    }
}

fn texts() -> Vec<String> {
    let mut texts: Vec<String> = [
        "Hello, world!",
        "The year 2024 had 366 days; pi is 3.14159265 and 1,000,000 is a million.",
        "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, emoji 🦀🚀👍🏽, combining é",
        "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{x:?}\");\n}\n",
        "def f(a, b):\n\treturn a  +  b   # tabs and   runs\n\n\n",
        "   leading spaces, trailing spaces   ",
        "\n\n\nnewlines\r\nand CRLF\r\n",
        "it's we'll they've I'M DON'T",
        "<|im_start|>user\nspecial tokens in text<|im_end|>\n<|endoftext|>",
        "<|im_start|broken <im_end|> <|im_end",
        "",
        " ",
        "a",
    ]
    .map(str::to_owned)
    .to_vec();
    texts.push("A long system prompt. ".repeat(200));
    texts.push((0..300).map(|i| format!("{i} ")).collect());
    texts
}

fn chat_bodies() -> Vec<Value> {
    vec![
        json!({"messages": [{"role": "user", "content": "hi"}]}),
        json!({"messages": [
            {"role": "system", "content": "You are terse.\nAnswer in one line."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "  and 3+3?  \n"}
        ]}),
        json!({"messages": [{"role": "system", "content": "Be kind. ".repeat(100)}, {"role": "user", "content": "日本語で 🦀"}]}),
        // Not ending in an assistant turn: llama.cpp takes one as a prefill to
        // continue, vLLM (add_generation_prompt, no continue_final_message)
        // opens a new assistant turn after it.
        json!({"messages": [{"role": "user", "content": "code:\n```rust\nfn f() {}\n```"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "more"}]}),
    ]
}

/// Keys of `parameters` and of the call's arguments in sorted order: kvgate's
/// serde_json (no preserve_order) sorts object keys, so a client's unsorted
/// keys there render in another order than in vLLM and llama.cpp. The tool's
/// own fields are put in vLLM's order whatever the client's.
fn tools_body() -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "  weather in Paris?  "},
            {"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{\"city\": \"Paris <é>\", \"n\": 1.5}", "name": "get_weather"}, "id": "c1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny & 20°C"}
        ],
        "tools": [{"function": {"description": "Weather & <more>", "name": "get_weather",
                   "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"}}, "type": "function"}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_tokens_and_templates_match_llama_cpp() {
    let Some((server, model)) = llama_paths() else {
        return;
    };
    let (plain, tools) = tokio::join!(
        Llama::start(&server, &model, &[]),
        Llama::start(
            &server,
            &model,
            &["--jinja", "--chat-template-file", TOOLS_TEMPLATE]
        )
    );
    let tok = PromptTokenizer::load(FIXTURE, None).unwrap();
    let mut mismatches = Vec::new();

    for text in texts() {
        for add_special in [false, true] {
            let want = plain.tokenize(&text, add_special).await;
            // Twice: cold, then from the segment cache.
            for pass in ["cold", "warm"] {
                let got = tok.encode(&text, add_special);
                if got != want {
                    mismatches.push(format!(
                        "encode({text:?}, {add_special}) {pass}: {got:?} != llama {want:?}"
                    ));
                }
            }
            if add_special {
                let got = tok.completion(&json!(text), usize::MAX).unwrap().ids;
                if got != want {
                    mismatches.push(format!("completion({text:?}): {got:?} != llama {want:?}"));
                }
            }
        }
    }

    let with_tools = PromptTokenizer::load(FIXTURE, Some(Path::new(TOOLS_TEMPLATE))).unwrap();
    let cases = chat_bodies().into_iter().map(|b| (&tok, &plain, b));
    let cases = cases.chain(
        chat_bodies()
            .into_iter()
            .chain([tools_body()])
            .map(|b| (&with_tools, &tools, b)),
    );
    for (tok, llama, body) in cases {
        let want = llama.apply_template(&body).await;
        let got = tok.render_chat(&body).unwrap();
        if got != want {
            mismatches.push(format!(
                "render_chat({body}):\n  ours:  {got:?}\n  llama: {want:?}"
            ));
        }
        let want_ids = llama.tokenize(&want, false).await;
        let got_ids = tok.chat(&body, usize::MAX).unwrap().ids;
        if got_ids != want_ids {
            mismatches.push(format!("chat({body}): {got_ids:?} != llama {want_ids:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches with llama.cpp:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
