//! The HTTP surface: response and SSE formats, SageMaker and admin routes, and
//! OpenAI-shaped errors for every malformed request.

mod common;

use common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn non_streaming_chat_and_completion_responses() {
    let sim = start(cfg()).await;
    let resp = post(
        &sim,
        "/v1/chat/completions",
        &chat_body("hello there", json!({"max_tokens": 3})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-t-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], " the kv is");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // "<|user|>\nhello there\n<|assistant|>\n" = 35 bytes = 9 tokens.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );

    let v: Value = post(&sim, "/v1/completions", &json!({"prompt": "abcdefgh"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["model"], "meta-llama/Llama-3.1-70B-Instruct",
        "default model"
    );
    assert_eq!(v["usage"]["completion_tokens"], 4, "default_max_tokens");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["choices"][0]["text"], " the kv is hot");
    let st = sim.server.stats();
    assert_eq!(
        (st.requests, st.prompt_tokens, st.generation_tokens),
        (2, 11, 7)
    );
}

#[tokio::test]
async fn chat_stream_is_openai_sse() {
    let sim = start(cfg()).await;
    let body = chat_body(
        "stream me",
        json!({"stream": true, "max_completion_tokens": 3, "stream_options": {"include_usage": true}}),
    );
    let resp = post(&sim, "/v1/chat/completions", &body).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    let ev = events(&text);
    assert_eq!(ev.len(), 1 + 3 + 1 + 1 + 1, "{text}");
    for e in &ev[..6] {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["id"], ev[0]["id"]);
    }
    assert_eq!(
        ev[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let words: Vec<&str> = ev[1..4]
        .iter()
        .map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(words, [" the", " kv", " is"]);
    assert!(
        ev[1..4]
            .iter()
            .all(|e| e["choices"][0]["finish_reason"].is_null())
    );
    assert_eq!(ev[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(ev[4]["choices"][0]["delta"], json!({}));
    assert_eq!(ev[5]["choices"], json!([]));
    assert_eq!(ev[5]["usage"]["completion_tokens"], 3);
    assert_eq!(ev[5]["usage"]["prompt_tokens"], 9);
    assert_eq!(ev[6], "[DONE]");
}

#[tokio::test]
async fn completion_stream_without_usage() {
    let sim = start(cfg()).await;
    let (_, text) = stream(
        &sim,
        "/v1/completions",
        &json!({"prompt": "abcd", "stream": true, "max_tokens": 2}),
    )
    .await;
    let ev = events(&text);
    assert_eq!(ev.len(), 2 + 1 + 1, "{text}");
    assert_eq!(ev[0]["object"], "text_completion");
    assert_eq!(ev[0]["choices"][0]["text"], " the");
    assert_eq!(ev[2]["choices"][0]["finish_reason"], "length");
    assert!(ev.iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test]
async fn sagemaker_invocations_accept_messages_prompt_and_inputs() {
    let sim = start(cfg()).await;
    for body in [
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        json!({"prompt": "hi", "max_tokens": 2}),
        json!({"inputs": "hi", "parameters": {"max_new_tokens": 2}}),
    ] {
        let v: Value = post(&sim, "/invocations", &body)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v["object"], "chat.completion", "{body}");
        assert_eq!(v["usage"]["completion_tokens"], 2, "{body}");
    }
    let (_, text) = stream(
        &sim,
        "/invocations",
        &json!({"inputs": "hi", "stream": true, "max_tokens": 1}),
    )
    .await;
    assert_eq!(events(&text)[0]["choices"][0]["delta"]["role"], "assistant");
}

#[tokio::test]
async fn health_models_and_metrics() {
    let sim = start(cfg()).await;
    let c = client();
    for path in ["/ping", "/health"] {
        assert_eq!(
            c.get(format!("{}{path}", sim.url()))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let models: Value = c
        .get(format!("{}/v1/models", sim.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "meta-llama/Llama-3.1-70B-Instruct");

    post(
        &sim,
        "/v1/completions",
        &json!({"prompt": text(1, 64), "max_tokens": 1}),
    )
    .await;
    post(
        &sim,
        "/v1/completions",
        &json!({"prompt": text(1, 64), "max_tokens": 1}),
    )
    .await;
    let resp = c
        .get(format!("{}/metrics", sim.url()))
        .send()
        .await
        .unwrap();
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let m = resp.text().await.unwrap();
    let value = |name: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(name) && l.as_bytes().get(name.len()) == Some(&b'{'))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("vllm:prefix_cache_queries_total"), 128.0);
    assert_eq!(
        value("vllm:prefix_cache_hits_total"),
        48.0,
        "3 of 4 blocks; the last is recomputed"
    );
    assert_eq!(value("vllm:prompt_tokens_total"), 128.0);
    assert_eq!(value("vllm:generation_tokens_total"), 2.0);
    assert_eq!(value("vllm:num_requests_running"), 0.0);
    assert_eq!(value("vllm:num_requests_waiting"), 0.0);
    assert_eq!(value("vllm:time_to_first_token_seconds_count"), 2.0);
    assert!(m.contains(r#"server="t""#));
}

#[tokio::test]
async fn metrics_expose_the_kv_capacity_as_vllms_cache_config_info() {
    let sim = start(cfg_with(|c| {
        c.block_size = 32;
        c.cache_blocks = 1_234;
    }))
    .await;
    let m = client()
        .get(format!("{}/metrics", sim.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.lines()
            .any(|l| l == "# TYPE vllm:cache_config_info gauge"),
        "{m}"
    );
    let line = m
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap_or_else(|| panic!("no cache_config_info:\n{m}"));
    let (labels, value) = line
        .strip_prefix("vllm:cache_config_info{")
        .and_then(|rest| rest.rsplit_once("} "))
        .unwrap();
    assert_eq!(value.parse::<f64>().unwrap(), 1.0);
    let labels: Vec<(&str, &str)> = labels
        .split(',')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k, v.trim_matches('"'))
        })
        .collect();
    let label = |name: &str| labels.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    assert_eq!(label("block_size"), Some("32"));
    assert_eq!(label("num_gpu_blocks"), Some("1234"));
    assert_eq!(label("enable_prefix_caching"), Some("True"));
    assert_eq!(label("server"), Some("t"));
}

#[tokio::test]
async fn malformed_requests_get_openai_shaped_400s() {
    let sim = start(cfg()).await;
    let c = client();
    let raw = |path: &'static str, body: &'static str| {
        let req = c
            .post(format!("{}{path}", sim.url()))
            .header("content-type", "application/json")
            .body(body);
        async move { req.send().await.unwrap() }
    };
    let cases = [
        ("/v1/chat/completions", "{"),
        ("/v1/chat/completions", "[]"),
        ("/v1/chat/completions", "{}"),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"9"}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"cache_salt":""}"#,
        ),
        // Prompt + output larger than the whole KV cache.
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1000000}"#,
        ),
        ("/v1/completions", r#"{"prompt":["a","b"]}"#),
        ("/v1/completions", r#"{"prompt":""}"#),
        ("/invocations", r#"{"parameters":{}}"#),
        ("/invocations", "\u{0}\u{ff}"),
    ];
    for (path, body) in cases {
        let resp = raw(path, body).await;
        assert_eq!(resp.status(), 400, "{path} {body}");
        let v: Value = resp.json().await.unwrap();
        let err = &v["error"];
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert_eq!(err["type"], "BadRequestError");
        assert_eq!(err["code"], 400);
        assert!(err.as_object().unwrap().contains_key("param"));
    }
    assert_eq!(sim.server.stats().requests, 0, "nothing reached the engine");

    let resp = c.get(format!("{}/nope", sim.url())).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "NotFoundError");
    let resp = c
        .get(format!("{}/v1/chat/completions", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], 405);
}

#[tokio::test]
async fn handle_shutdown_stops_listening() {
    let sim = start(cfg()).await;
    let url = sim.url();
    assert_eq!(
        client()
            .get(format!("{url}/ping"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    sim.shutdown().await.unwrap();
    assert!(
        reqwest::Client::new()
            .get(format!("{url}/ping"))
            .send()
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_fleet_gets_distinct_names_and_ports() {
    let fleet = kvgate_sim::spawn_fleet(&cfg(), 3).await.unwrap();
    let names: Vec<&str> = fleet
        .iter()
        .map(|h| h.server.config().name.as_str())
        .collect();
    assert_eq!(names, ["t-0", "t-1", "t-2"]);
    assert_ne!(fleet[0].addr, fleet[1].addr);
}
