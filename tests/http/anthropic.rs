//! Anthropic's Messages API through the gateway: the body and its stream
//! passed through untouched, `x-api-key` as a tenant credential that stays
//! behind, `anthropic-*` headers forwarded, usage read in Anthropic's terms,
//! a session kept on one instance, and every bad body or failure answered in
//! Anthropic's error shape with nothing forwarded.

use serde_json::json;
use sha2::{Digest, Sha256};

use super::*;

const ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"test-model","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":40,"output_tokens":5,"cache_read_input_tokens":960}}"#;

fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// `config` with API keys (tenants a and b; b may use no model of ours),
/// a one-request-a-minute tenant, and an endpoint of its own name.
fn keyed(ups: &[&Upstream], name: &str) -> String {
    format!(
        "{}auth:\n  mode: api_key\n  api_keys:\n    - {{ tenant: a, sha256: \"{}\" }}\n    - {{ tenant: b, sha256: \"{}\" }}\n    - {{ tenant: slow, sha256: \"{}\" }}\ntenants:\n  overrides:\n    b: {{ models: [\"other-model\"] }}\n    slow: {{ requests_per_minute: 1 }}\nisolation:\n  salt_secret: \"test-only-salt-secret-0123456789\"\n",
        config(MODEL, ups, "prefix_aware", 10)
            .replace("name: chat", &format!("name: {name}"))
            .replace(
                &format!("[\"{MODEL}\"]"),
                &format!("[\"{MODEL}\", \"other-model\"]")
            ),
        sha("sk-a"),
        sha("sk-b"),
        sha("sk-slow"),
    )
}

fn turn(session: Option<&str>, turns: usize) -> serde_json::Value {
    let mut messages = Vec::new();
    for i in 0..turns {
        messages.push(json!({"role": "user", "content": format!("step {i}: run the tests")}));
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("t{i}"), "name": "bash", "input": {"cmd": "cargo test"}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{i}"), "content": format!("{i} passed")}]}));
    }
    messages.push(json!({"role": "user", "content": "go on"}));
    let mut body = json!({"model": MODEL, "max_tokens": 64, "system": "You are a coding agent.", "messages": messages});
    if let Some(s) = session {
        body["metadata"] = json!({"user_id": s});
    }
    body
}

async fn send(
    gw: &Gateway,
    path: &str,
    key: Option<&str>,
    body: Vec<u8>,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .body(body);
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    let r = req.send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.text().await.unwrap())
}

/// What is sent, as whom, and the status and `error.type` it must get.
type Refusal = (
    &'static str,
    Option<&'static str>,
    Vec<u8>,
    u16,
    &'static str,
);

/// `error.type` of an Anthropic error body (panics on any other shape).
fn error_type(text: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(v["type"], "error", "{text}");
    assert!(v["error"]["message"].is_string(), "{text}");
    v["error"]["type"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_call_passes_through_with_its_headers_and_usage_but_not_its_key() {
    let up = Upstream::start("u0", Mode::Raw(200, "application/json", ANSWER)).await;
    let gw = Gateway::start(&keyed(&[&up], "anthropic-pass")).await;
    let body = serde_json::to_vec(&turn(None, 1)).unwrap();
    let (status, _, text) = send(&gw, "/v1/messages", Some("sk-a"), body.clone()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text, ANSWER);
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/messages");
    // The body as sent, plus the tenant's cache salt (vLLM's Messages route
    // honours `cache_salt` as chat does).
    let mut forwarded: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    let salt = forwarded.as_object_mut().unwrap().remove("cache_salt");
    assert!(
        salt.as_ref().is_some_and(serde_json::Value::is_string),
        "{forwarded}"
    );
    assert_eq!(
        forwarded,
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()
    );
    let h = &seen[0].headers;
    assert_eq!(h["anthropic-version"], "2023-06-01");
    assert_eq!(h["anthropic-beta"], "prompt-caching-2024-07-31");
    assert!(!h.contains_key("x-api-key") && !h.contains_key("authorization"));
    // Usage in Anthropic's terms: input_tokens excludes what was read from cache.
    let m = gw.metrics().await;
    let upstream = format!("endpoint=\"anthropic-pass\",upstream=\"{}\"", up.url());
    let value = |family: &str| {
        m.lines()
            .find(|l| l.starts_with(family) && l.contains(&upstream))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(
        value("kvgate_upstream_prompt_tokens_total"),
        Some(1000.0),
        "{m}"
    );
    assert_eq!(
        value("kvgate_upstream_cached_tokens_total"),
        Some(960.0),
        "{m}"
    );
    assert_eq!(
        value("kvgate_upstream_completion_tokens_total"),
        Some(5.0),
        "{m}"
    );
    assert!(m.contains("api=\"messages\""), "{m}");
    // count_tokens: routed and tenant-checked like the rest.
    let (status, _, _) = send(&gw, "/v1/messages/count_tokens", Some("sk-a"), body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(up.seen()[1].path, "/v1/messages/count_tokens");
    let (status, _, text) = send(&gw, "/v1/messages/count_tokens", Some("sk-b"), body).await;
    assert_eq!(
        (status, error_type(&text).as_str()),
        (403, "permission_error")
    );
    assert_eq!(up.seen().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_in_anthropics_shape_and_nothing_is_forwarded() {
    let up = Upstream::start("u0", Mode::Raw(200, "application/json", ANSWER)).await;
    let yaml =
        keyed(&[&up], "anthropic-bad").replace("max_body_bytes: 65536", "max_body_bytes: 10485760");
    let gw = Gateway::start(&yaml).await;
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut b = turn(None, 1);
        f(&mut b);
        serde_json::to_vec(&b).unwrap()
    };
    let nested = format!("{}{{}}{}", "{\"a\":".repeat(200), "}".repeat(200));
    let deep_tools = format!(
        r#"{{"model":"{MODEL}","max_tokens":8,"messages":[{{"role":"user","content":"x"}}],"tools":[{{"name":"t","input_schema":{nested}}}]}}"#
    );
    let mut not_utf8 = with(&|_| {});
    let at = not_utf8.windows(5).position(|w| w == b"go on").unwrap();
    not_utf8[at] = 0xff;
    let big = with(&|b| {
        b["messages"][2]["content"][0]["content"] = json!("x".repeat(10 * 1024 * 1024));
    });
    let cases: Vec<Refusal> = vec![
        (
            "missing max_tokens",
            Some("sk-a"),
            with(&|b| {
                b.as_object_mut().unwrap().remove("max_tokens");
            }),
            400,
            "invalid_request_error",
        ),
        (
            "max_tokens zero",
            Some("sk-a"),
            with(&|b| b["max_tokens"] = json!(0)),
            400,
            "invalid_request_error",
        ),
        (
            "messages not a list",
            Some("sk-a"),
            with(&|b| b["messages"] = json!({"role": "user"})),
            400,
            "invalid_request_error",
        ),
        (
            "unknown block type",
            Some("sk-a"),
            with(&|b| b["messages"][0]["content"] = json!([{"type": "hologram", "data": "x"}])),
            400,
            "invalid_request_error",
        ),
        (
            "a role Messages lacks",
            Some("sk-a"),
            with(&|b| b["messages"][0]["role"] = json!("tool")),
            400,
            "invalid_request_error",
        ),
        (
            "bad session hint",
            Some("sk-a"),
            with(&|b| b["metadata"] = json!({"user_id": 7})),
            400,
            "invalid_request_error",
        ),
        (
            "deeply nested tool schema",
            Some("sk-a"),
            deep_tools.into_bytes(),
            400,
            "invalid_request_error",
        ),
        (
            "not UTF-8",
            Some("sk-a"),
            not_utf8,
            400,
            "invalid_request_error",
        ),
        (
            "a 10 MiB tool result",
            Some("sk-a"),
            big,
            413,
            "request_too_large",
        ),
        (
            "unknown model",
            Some("sk-a"),
            with(&|b| b["model"] = json!("nope")),
            404,
            "not_found_error",
        ),
        (
            "model not allowed",
            Some("sk-b"),
            with(&|_| {}),
            403,
            "permission_error",
        ),
        ("no key", None, with(&|_| {}), 401, "authentication_error"),
        (
            "wrong key",
            Some("sk-wrong"),
            with(&|_| {}),
            401,
            "authentication_error",
        ),
    ];
    for (what, key, body, status, ty) in cases {
        let (got, _, text) = send(&gw, "/v1/messages", key, body).await;
        assert_eq!(got, status, "{what}: {text}");
        assert_eq!(error_type(&text), ty, "{what}");
    }
    assert!(up.seen().is_empty(), "a bad request was forwarded");
    // Quota: the second request a minute is a 429 with retry-after.
    let ok = serde_json::to_vec(&turn(None, 1)).unwrap();
    assert_eq!(
        send(&gw, "/v1/messages", Some("sk-slow"), ok.clone())
            .await
            .0,
        200
    );
    let (status, headers, text) = send(&gw, "/v1/messages", Some("sk-slow"), ok).await;
    assert_eq!(
        (status, error_type(&text).as_str()),
        (429, "rate_limit_error")
    );
    assert!(headers.contains_key("retry-after"));
    // The gateway is unharmed.
    let health = client().get(gw.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_instance_left_is_an_overloaded_529_and_an_upstream_error_keeps_its_status() {
    let down = super::sagemaker::closed_port().await;
    let yaml = format!(
        "server:\n  listen: \"127.0.0.1:0\"\n  failover_cooldown_ms: 60000\nendpoints:\n  - name: down\n    models: [\"{MODEL}\"]\n    instances:\n      - url: \"{down}\"\n    routing:\n      strategy: prefix_aware\n"
    );
    let gw = Gateway::start(&yaml).await;
    let body = serde_json::to_vec(&turn(None, 1)).unwrap();
    let (first, _, text) = send(&gw, "/v1/messages", None, body.clone()).await;
    assert!(first == 502 || first == 529, "{first} {text}");
    error_type(&text);
    let (status, headers, text) = send(&gw, "/v1/messages", None, body.clone()).await;
    assert_eq!(
        (status, error_type(&text).as_str()),
        (529, "overloaded_error")
    );
    assert_eq!(headers["retry-after"], "1");
    // An engine's own error answer: its status, Anthropic's shape.
    let up = Upstream::start("u0", Mode::Raw(400, "application/json", r#"{"object":"error","message":"prompt is too long","type":"BadRequestError","code":400}"#)).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let (status, _, text) = send(&gw, "/v1/messages", None, body).await;
    assert_eq!(
        (status, error_type(&text).as_str()),
        (400, "invalid_request_error")
    );
    assert!(text.contains("prompt is too long"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_stream_arrives_untouched_and_leaving_it_cancels_the_engine() {
    let events = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":8,\"output_tokens\":0,\"cache_read_input_tokens\":32}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"h\u{e9}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ];
    let chunks: Vec<String> = events.iter().map(|e| (*e).to_owned()).collect();
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks: chunks.clone(),
            gap: Duration::from_millis(20),
        },
    )
    .await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let mut body = turn(None, 1);
    body["stream"] = json!(true);
    let bytes = serde_json::to_vec(&body).unwrap();
    let (status, headers, text) = send(&gw, "/v1/messages", None, bytes.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(text, chunks.concat());
    // A client that leaves mid-stream: the engine's request is cancelled.
    *up.state.mode.lock().unwrap() = Mode::Stream {
        chunks,
        gap: Duration::from_secs(60),
    };
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("content-type", "application/json")
        .body(bytes)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"event: message_start"));
    drop(stream);
    eventually("upstream stream cancelled", || up.cancelled() == 1).await;
    gw.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_on_one_instance_while_its_prefix_grows_and_never_crosses_tenants() {
    let ups = [
        Upstream::start("u0", Mode::Raw(200, "application/json", ANSWER)).await,
        Upstream::start("u1", Mode::Raw(200, "application/json", ANSWER)).await,
        Upstream::start("u2", Mode::Raw(200, "application/json", ANSWER)).await,
        Upstream::start("u3", Mode::Raw(200, "application/json", ANSWER)).await,
    ];
    let refs: Vec<&Upstream> = ups.iter().collect();
    let gw = Gateway::start(&keyed(&refs, "anthropic-session")).await;
    let served = |ups: &[Upstream]| -> Vec<usize> { ups.iter().map(|u| u.seen().len()).collect() };
    let mut homes = std::collections::BTreeSet::new();
    for session in ["s-1", "s-2", "s-3", "s-4", "s-5", "s-6"] {
        let before = served(&ups);
        // Six turns whose window (well under prefix_length) grows each turn.
        for turns in 1..=6 {
            let body = serde_json::to_vec(&turn(Some(session), turns)).unwrap();
            assert_eq!(send(&gw, "/v1/messages", Some("sk-a"), body).await.0, 200);
        }
        let after = served(&ups);
        let got: Vec<usize> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(
            got.iter().filter(|n| **n > 0).count(),
            1,
            "{session} spread over {got:?}"
        );
        homes.insert(got.iter().position(|n| *n > 0));
    }
    assert!(homes.len() > 1, "every session on one instance: {homes:?}");
    // Without the hint, the growing window moves the same conversation.
    let before = served(&ups);
    for turns in 1..=6 {
        let body = serde_json::to_vec(&turn(None, turns)).unwrap();
        assert_eq!(send(&gw, "/v1/messages", Some("sk-a"), body).await.0, 200);
    }
    let got: Vec<usize> = served(&ups)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    assert!(got.iter().filter(|n| **n > 0).count() > 1, "{got:?}");
    // The same session id in two tenants is two keys.
    let key = |credential: &'static str| {
        let gw = &gw;
        async move {
            let r = gw
                .explain("/v1/messages", Some(credential), &turn(Some("s-1"), 1))
                .await;
            let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
            assert_eq!(v["session"], "s-1", "{v}");
            v["key"].clone()
        }
    };
    let (a, slow) = (key("sk-a").await, key("sk-slow").await);
    assert!(a.is_string() || a.is_number(), "{a}");
    assert_ne!(a, slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropics_python_sdk_works_unchanged_against_the_gateway() {
    let cfg = kvgate_sim::SimConfig {
        model: MODEL.into(),
        time_scale: 0.0,
        ..kvgate_sim::SimConfig::llama70b_h100_tp4()
    };
    let sims = kvgate_sim::spawn_fleet(&cfg, 2).await.unwrap();
    let instances: String = sims
        .iter()
        .map(|s| format!("      - url: \"{}\"\n", s.url()))
        .collect();
    let yaml = format!(
        "server:\n  listen: \"127.0.0.1:0\"\nendpoints:\n  - name: agents\n    models: [\"{MODEL}\", \"other-model\"]\n    instances:\n{instances}    routing:\n      strategy: longest_prefix\nauth:\n  mode: api_key\n  api_keys:\n    - {{ tenant: a, sha256: \"{}\" }}\n    - {{ tenant: b, sha256: \"{}\" }}\n    - {{ tenant: slow, sha256: \"{}\" }}\ntenants:\n  overrides:\n    b: {{ models: [\"other-model\"] }}\n    slow: {{ requests_per_minute: 1 }}\nisolation:\n  salt_secret: \"test-only-salt-secret-0123456789\"\n",
        sha("sk-a"),
        sha("sk-b"),
        sha("sk-slow"),
    );
    let gw = Gateway::start(&yaml).await;
    let down = super::sagemaker::closed_port().await;
    let down = Gateway::start(&format!(
        "server:\n  listen: \"127.0.0.1:0\"\n  failover_cooldown_ms: 60000\nendpoints:\n  - name: down\n    models: [\"{MODEL}\"]\n    instances:\n      - url: \"{down}\"\n"
    ))
    .await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/sdk/anthropic_interop.py"
    );
    super::sdk::python(script, &[&gw.url(""), MODEL, &down.url("")], None).await;
    // The SDK's requests were served by the sims: the gateway forwarded
    // every good one and no refused one.
    let m = gw.metrics().await;
    assert!(m.contains("api=\"messages\""), "{m}");
}
