//! What crosses the gateway: streams byte for byte and chunk by chunk,
//! cancellation when the client leaves, headers, `/v1/models`, and every kind
//! of bad input answered with a 4xx in the route's shape (OpenAI's, SageMaker's on
//! `/endpoints/*`, Anthropic's on `/v1/messages*`) and nothing forwarded.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

#[path = "http/anthropic.rs"]
mod anthropic;
mod common;
#[path = "http/console.rs"]
mod console;
#[path = "http/dashboards.rs"]
mod dashboards;
#[path = "http/framing.rs"]
mod framing;
#[path = "http/h2.rs"]
mod h2;
#[path = "http/openai.rs"]
mod openai;
#[path = "http/sagemaker.rs"]
mod sagemaker;
#[path = "http/sdk.rs"]
mod sdk;
#[path = "http/sigv4.rs"]
mod sigv4;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MODEL: &str = "test-model";

fn sse_chunks() -> Vec<String> {
    let mut v: Vec<String> = (0..5)
        .map(|i| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \\u00e9\"}}}}]}}\n\n"))
        .collect();
    v.push("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n".into());
    v.push("data: [DONE]\n\n".into());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_streams_through_chunk_by_chunk_and_byte_identical() {
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks: sse_chunks(),
            gap: Duration::from_millis(150),
        },
    )
    .await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let resp = gw.chat(&chat_body(MODEL, "sys", "hi", true)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["x-accel-buffering"], "no");
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    // The first chunk arrived while the upstream was still producing the rest.
    assert_eq!(
        up.state.active.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "upstream already finished: the stream was buffered"
    );
    let mut got = first.to_vec();
    while let Some(c) = body.next().await {
        got.extend_from_slice(&c.unwrap());
    }
    assert_eq!(got, sse_chunks().concat().into_bytes());
    let rt = gw.state.runtime.load_full();
    assert_eq!(rt.endpoint("chat").unwrap().instances[0].in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_a_stream_closes_the_upstream() {
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks: sse_chunks(),
            gap: Duration::from_secs(60),
        },
    )
    .await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let resp = gw.chat(&chat_body(MODEL, "sys", "hi", true)).await;
    let mut body = resp.bytes_stream();
    let _first = body.next().await.unwrap().unwrap();
    drop(body);
    eventually("upstream stream cancelled", || up.cancelled() == 1).await;
    gw.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_before_the_answer_closes_the_upstream() {
    let up = Upstream::start("u0", Mode::Hold).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let body = serde_json::to_vec(&chat_body(MODEL, "sys", "hi", false)).unwrap();
    let req = client()
        .post(gw.url("/v1/chat/completions"))
        .body(body)
        .send();
    let t = tokio::spawn(req);
    eventually("request reached upstream", || up.hits() == 1).await;
    t.abort();
    eventually("upstream request cancelled", || up.cancelled() == 1).await;
    gw.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_request_id_and_body_reach_upstream_as_they_should() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let raw = format!(
        "{{ \"model\" : \"{MODEL}\", \"messages\": [{{\"role\":\"user\",\"content\":\"hi\"}}] }}"
    );
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json; charset=utf-8")
        .header("x-request-id", "req-123")
        .header("authorization", "Bearer client-secret")
        .header("x-custom", "kept")
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-123");
    let seen = &up.seen()[0];
    assert_eq!(seen.path, "/v1/chat/completions");
    assert_eq!(seen.body, raw.as_bytes());
    assert_eq!(seen.headers["x-request-id"], "req-123");
    assert_eq!(
        seen.headers["content-type"],
        "application/json; charset=utf-8"
    );
    assert_eq!(seen.headers["x-custom"], "kept");
    assert!(
        seen.headers.get("authorization").is_none(),
        "client credentials leaked upstream"
    );

    // Without one, an id is made and sent both ways.
    let resp = client()
        .post(gw.url("/v1/completions"))
        .body(format!(r#"{{"model":"{MODEL}","prompt":"once upon"}}"#))
        .send()
        .await
        .unwrap();
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(id.len() >= 16);
    let seen = &up.seen()[1];
    assert_eq!(seen.path, "/v1/completions");
    assert_eq!(seen.headers["x-request-id"].to_str().unwrap(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_lists_the_configured_models() {
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml = config(MODEL, &[&up], "prefix_aware", 10).replace(
        &format!("models: [\"{MODEL}\"]"),
        &format!("models: [\"{MODEL}\", \"other/model-2\"]"),
    );
    let gw = Gateway::start(&yaml).await;
    let v: serde_json::Value = serde_json::from_slice(
        &client()
            .get(gw.url("/v1/models"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![MODEL, "other/model-2"]);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(up.hits(), 0);
}

/// (what, path, extra header, body) → expected status and error code.
/// What a bad input is, its path, an extra header, its body, the expected status and error code.
type BadInput = (
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
    Vec<u8>,
    u16,
    &'static str,
);

fn bad_inputs() -> Vec<BadInput> {
    let chat = "/v1/chat/completions";
    let native = "/endpoints/chat/invocations";
    let ok_msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
    vec![
        ("malformed JSON", chat, None, b"{\"model\": \"test-model\", ".to_vec(), 400, "invalid_json"),
        ("empty body", chat, None, Vec::new(), 400, "invalid_json"),
        ("invalid UTF-8", chat, None, b"{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}".to_vec(), 400, "invalid_json"),
        ("lone surrogate", chat, None, br#"{"model":"test-model","messages":[{"role":"user","content":"\ud800"}]}"#.to_vec(), 400, "invalid_json"),
        ("duplicate keys", chat, None, format!(r#"{{"model":"test-model","model":"x",{ok_msgs}}}"#).into_bytes(), 400, "invalid_json"),
        ("deep nesting", native, None, format!("{}{}", "[".repeat(30_000), "]".repeat(30_000)).into_bytes(), 400, "invalid_json"),
        ("10,000-digit number", native, None, format!("{{\"inputs\":{}}}", "9".repeat(10_000)).into_bytes(), 400, "invalid_json"),
        ("messages not an array", chat, None, br#"{"model":"test-model","messages":"hi"}"#.to_vec(), 400, "invalid_request"),
        ("message not an object", chat, None, br#"{"model":"test-model","messages":["hi"]}"#.to_vec(), 400, "invalid_request"),
        ("messages empty", chat, None, br#"{"model":"test-model","messages":[]}"#.to_vec(), 400, "invalid_request"),
        ("messages missing", chat, None, br#"{"model":"test-model"}"#.to_vec(), 400, "invalid_request"),
        ("model missing", chat, None, format!("{{{ok_msgs}}}").into_bytes(), 400, "invalid_request"),
        ("model not a string", chat, None, format!(r#"{{"model":7,{ok_msgs}}}"#).into_bytes(), 400, "invalid_request"),
        ("stream not a boolean", chat, None, format!(r#"{{"model":"test-model","stream":"yes",{ok_msgs}}}"#).into_bytes(), 400, "invalid_request"),
        ("prompt_cache_key with NUL", chat, None, format!(r#"{{"model":"test-model","prompt_cache_key":"a\u0000b",{ok_msgs}}}"#).into_bytes(), 400, "invalid_request"),
        ("body not an object", chat, None, b"[1,2]".to_vec(), 400, "invalid_request"),
        ("prompt missing", "/v1/completions", None, br#"{"model":"test-model"}"#.to_vec(), 400, "invalid_request"),
        ("unknown model", chat, None, format!(r#"{{"model":"nope",{ok_msgs}}}"#).into_bytes(), 404, "model_not_found"),
        ("unknown endpoint", "/endpoints/nope/invocations", None, br#"{"inputs":"x"}"#.to_vec(), 400, "ValidationError"),
        ("unknown route", "/v1/nothing-here", None, b"{}".to_vec(), 404, "route_not_found"),
        ("oversized body", chat, None, format!(r#"{{"model":"test-model","messages":[{{"role":"user","content":"{}"}}]}}"#, "a".repeat(70_000)).into_bytes(), 413, "payload_too_large"),
        ("wrong content type", chat, Some(("content-type", "text/plain")), format!(r#"{{"model":"test-model",{ok_msgs}}}"#).into_bytes(), 415, "unsupported_media_type"),
        ("prefix id empty", native, Some(("x-amzn-sagemaker-prefix-aware-id", "")), br#"{"inputs":"x"}"#.to_vec(), 400, "invalid_request"),
        ("prefix id only spaces", native, Some(("x-amzn-sagemaker-prefix-aware-id", "   ")), br#"{"inputs":"x"}"#.to_vec(), 400, "invalid_request"),
        ("prefix id too long", native, Some(("x-amzn-sagemaker-prefix-aware-id", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")), br#"{"inputs":"x"}"#.to_vec(), 400, "invalid_request"),
        ("prefix id control char", native, Some(("x-amzn-sagemaker-prefix-aware-id", "a\tb")), br#"{"inputs":"x"}"#.to_vec(), 400, "invalid_request"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_4xx_in_the_routes_shape_and_never_forwarded() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    for (what, path, header, body, status, code) in bad_inputs() {
        let mut req = client().post(gw.url(path)).body(body);
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(resp.headers()["content-type"], "application/json", "{what}");
        if path.starts_with("/endpoints/") {
            // SageMaker's routes answer in SageMaker's shape: all bad input
            // is a ValidationError (tests/http/sagemaker.rs has the rest).
            assert_eq!(resp.status().as_u16(), 400, "{what}");
            assert_eq!(
                resp.headers()["x-amzn-errortype"],
                "ValidationError",
                "{what}"
            );
            let v: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            assert!(
                v["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{what}: {v}"
            );
            assert_eq!(up.hits(), 0, "{what} was forwarded upstream");
            continue;
        }
        assert_eq!(resp.status().as_u16(), status, "{what}");
        let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert!(v["error"]["type"].is_string(), "{what}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.matches("not valid JSON").count() <= 1,
            "{what}: the message repeats itself: {message}"
        );
        assert_eq!(up.hits(), 0, "{what} was forwarded upstream");
    }
    // Wrong method on a known route.
    let resp = client()
        .get(gw.url("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    // Still serving.
    let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_reach_the_client_with_their_status_in_openai_shape() {
    let openai = r#"{"error":{"message":"context too long","type":"invalid_request_error","param":"messages","code":null}}"#;
    let cases: [(Mode, u16, &str); 4] = [
        (
            Mode::Raw(
                400,
                "application/json",
                r#"{"object":"error","message":"This model's maximum context length is 2048 tokens","type":"BadRequestError","param":null,"code":400}"#,
            ),
            400,
            "maximum context length is 2048",
        ),
        (
            Mode::Raw(500, "application/json", r#"{"error":"boom"}"#),
            500,
            "boom",
        ),
        (
            Mode::Raw(
                431,
                "text/html",
                "<html><body>431 Request Header Fields Too Large</body></html>",
            ),
            431,
            "431 Request Header Fields Too Large",
        ),
        (
            Mode::Raw(422, "application/json", openai),
            422,
            "context too long",
        ),
    ];
    for (mode, status, message) in cases {
        let up = Upstream::start("u0", mode).await;
        let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
        let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert!(
            !resp.headers().contains_key("server"),
            "the upstream's server header was relayed"
        );
        let bytes = resp.bytes().await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(m.contains(message), "{status}: {v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        if status == 422 {
            assert_eq!(
                bytes,
                openai.as_bytes(),
                "an OpenAI-shaped error is passed through as is"
            );
        }
        gw.drained().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_prefix_aware_id_headers_are_a_400_not_first_one_wins() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let resp = client()
        .post(gw.url("/endpoints/chat/invocations"))
        .header("content-type", "application/json")
        .header("x-amzn-sagemaker-prefix-aware-id", "a")
        .header("x-amzn-sagemaker-prefix-aware-id", "b")
        .body(r#"{"inputs":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-amzn-errortype"], "ValidationError");
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert!(
        v["message"].as_str().unwrap().contains("Prefix-Aware-Id"),
        "{v}"
    );
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_chunked_body_is_cut_off_with_413() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    // No content-length: the body arrives chunked and must be stopped while reading.
    let chunks =
        futures_util::stream::iter((0..100).map(|_| Ok::<_, std::io::Error>(vec![b' '; 4096])));
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    // The gateway may answer 413 before the client finished sending; either the
    // answer arrives or the connection is closed on the sender, never a 2xx.
    if let Ok(resp) = resp {
        assert_eq!(resp.status(), 413);
    }
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_framing_headers_are_refused() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let body = r#"{"model":"test-model","messages":[{"role":"user","content":"hi"}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_silences_on_a_stream_get_keepalive_comments_between_events() {
    // One event arrives in two halves with a silence between: no comment may go there.
    let mut chunks = sse_chunks();
    let first = chunks.remove(0);
    let (a, b) = first.split_at(10);
    chunks.insert(0, b.to_owned());
    chunks.insert(0, a.to_owned());
    let expected = chunks.concat();
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks,
            gap: Duration::from_millis(700),
        },
    )
    .await;
    let yaml = config(MODEL, &[&up], "prefix_aware", 10)
        .replace("server:\n", "server:\n  sse_keepalive_ms: 100\n");
    let gw = Gateway::start(&yaml).await;
    let resp = gw.chat(&chat_body(MODEL, "sys", "hi", true)).await;
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(text.contains(": ping\n\n"), "no keep-alive in {text:?}");
    // Without the comments, exactly the upstream's bytes: no event was split.
    assert_eq!(text.replace(": ping\n\n", ""), expected);
    assert!(
        !text.contains(&format!("{}: ping", &expected[..10])),
        "a comment split an event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_response_headers_in_time_is_a_504_and_the_upstream_is_released() {
    let up = Upstream::start("u0", Mode::Hold).await;
    let yaml = config(MODEL, &[&up], "prefix_aware", 10)
        .replace("server:\n", "server:\n  timeouts: { first_byte_ms: 300 }\n");
    let gw = Gateway::start(&yaml).await;
    let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert_eq!(resp.status(), 504);
    // The generation may still run upstream: SDKs must not send it again.
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "upstream_timeout");
    eventually("upstream request closed", || up.cancelled() == 1).await;
    gw.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_silent_past_the_idle_timeout_is_cut_off() {
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks: sse_chunks(),
            gap: Duration::from_secs(30),
        },
    )
    .await;
    let yaml = config(MODEL, &[&up], "prefix_aware", 10).replace(
        "server:\n",
        "server:\n  sse_keepalive_ms: 0\n  timeouts: { idle_ms: 300 }\n",
    );
    let gw = Gateway::start(&yaml).await;
    let resp = gw.chat(&chat_body(MODEL, "s", "q", true)).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(first, sse_chunks()[0].as_bytes());
    // The stream ends in an error (a truncated chunked body) instead of hanging.
    let rest = tokio::time::timeout(Duration::from_secs(20), body.next())
        .await
        .expect("stream hung past the idle timeout");
    assert!(!matches!(rest, Some(Ok(_))), "got more data: {rest:?}");
    eventually("upstream closed", || up.cancelled() == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_gets_a_408_in_openai_shape() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml = config(MODEL, &[&up], "prefix_aware", 10).replace(
        "  failover_cooldown_ms: 60000\n",
        "  failover_cooldown_ms: 60000\n  timeouts:\n    body_read_ms: 300\n",
    );
    let gw = Gateway::start(&yaml).await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":")
        .await
        .unwrap();
    // ...and nothing more: the gateway answers instead of waiting for ever.
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no answer to a stalled body");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert_eq!(up.hits(), 0);
}
