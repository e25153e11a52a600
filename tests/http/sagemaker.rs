//! SageMaker's wire on `/endpoints/*`: errors in SageMaker's shape, the
//! event-stream answer frame by frame, SigV4 tenants, the response headers —
//! over raw HTTP here (SigV4 in `sigv4.rs`), and through boto3 itself
//! (`tests/sdk/sagemaker_interop.py`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_smithy_eventstream::frame::read_message_from;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use super::common::*;

/// A model container: `/invocations` echoes the body and names itself; a
/// body with `"stream": true` streams five parts and holds the last one
/// until `GET /release`; `"fail": N` answers status N; `"break": true`
/// breaks the stream off after one part.
pub struct Container {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Bytes>>>,
}

#[derive(Clone)]
struct ContainerState {
    name: String,
    seen: Arc<Mutex<Vec<Bytes>>>,
    release: Arc<Notify>,
}

pub const PARTS: [&str; 5] = ["part-0 ", "part-1 ", "part-2 ", "part-3 ", "part-4-final"];

impl Container {
    pub async fn start(name: &str) -> Self {
        let state = ContainerState {
            name: name.to_owned(),
            seen: Arc::default(),
            release: Arc::new(Notify::new()),
        };
        let seen = Arc::clone(&state.seen);
        let app = Router::new()
            .route("/invocations", axum::routing::post(invocations))
            .route(
                "/release",
                axum::routing::get(|State(s): State<ContainerState>| async move {
                    s.release.notify_one();
                    "released"
                }),
            )
            .with_state(state);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, seen }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn bodies(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    }
}

async fn invocations(State(s): State<ContainerState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    s.seen.lock().unwrap().push(body.clone());
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let mut resp = Response::builder().header("x-instance", s.name.as_str());
    if let Some(attrs) = parts
        .headers
        .get("x-amzn-sagemaker-custom-attributes")
        .and_then(|v| v.to_str().ok())
    {
        resp = resp.header(
            "x-amzn-sagemaker-custom-attributes",
            format!("seen={attrs}"),
        );
    }
    if let Some(code) = v["fail"].as_u64() {
        return resp
            .status(StatusCode::from_u16(code as u16).unwrap())
            .header("content-type", "application/json")
            .body(Body::from(r#"{"error":"boom"}"#))
            .unwrap();
    }
    if v["stream"] == true {
        let broken = v["break"] == true;
        let release = Arc::clone(&s.release);
        let s = futures_util::stream::unfold(0usize, move |i| {
            let release = Arc::clone(&release);
            async move {
                match i {
                    _ if broken && i == 1 => {
                        // Break off once the client has the first part.
                        let _ =
                            tokio::time::timeout(Duration::from_secs(30), release.notified()).await;
                        Some((Err(std::io::Error::other("model crashed")), 9))
                    }
                    0..=3 => Some((Ok(Bytes::from_static(PARTS[i].as_bytes())), i + 1)),
                    4 => {
                        // Only a client that has seen parts 0-3 releases this one;
                        // a gateway that buffered would reach the timeout instead.
                        let last =
                            match tokio::time::timeout(Duration::from_secs(30), release.notified())
                                .await
                            {
                                Ok(()) => PARTS[4],
                                Err(_) => "part-4-never-released",
                            };
                        Some((Ok(Bytes::from_static(last.as_bytes())), 5))
                    }
                    _ => None,
                }
            }
        });
        return resp
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(s))
            .unwrap();
    }
    let answer = serde_json::json!({ "instance": s.name, "received": v });
    resp.header("content-type", "application/json")
        .body(Body::from(answer.to_string()))
        .unwrap()
}

pub const ACME_KEY: &str = "AKIAACMEEXAMPLE";
pub const ACME_SECRET: &str = "acme-secret-key-0123456789abcdef";
pub const LIMITED_KEY: &str = "AKIALIMITEDEXAMPLE";
pub const LIMITED_SECRET: &str = "limited-secret-key-0123456789abc";

/// A gateway over three containers (`chat`) and one closed port (`down`);
/// `auth` is the `auth:` section or empty.
pub fn sagemaker_config(containers: &[&Container], down: &str, auth: &str) -> String {
    let instances: String = containers
        .iter()
        .enumerate()
        .map(|(i, c)| format!("      - {{ url: \"{}\", id: i{i} }}\n", c.url()))
        .collect();
    format!(
        r#"server:
  listen: "127.0.0.1:0"
  max_body_bytes: 65536
  sse_keepalive_ms: 20
  failover_cooldown_ms: 60000
{auth}
endpoints:
  - name: chat
    models: ["m"]
    instances:
{instances}    routing:
      strategy: prefix_aware
      prefix_length: 1024
      concurrency_threshold: 100
  - name: down
    models: ["m-down"]
    instances:
      - {{ url: "{down}", id: d0 }}
"#
    )
}

pub fn sigv4_auth() -> String {
    format!(
        r#"auth:
  mode: sigv4
  sigv4:
    region: us-east-1
    credentials:
      - {{ tenant: acme, access_key_id: {ACME_KEY}, secret_access_key: "{ACME_SECRET}" }}
      - {{ tenant: limited, access_key_id: {LIMITED_KEY}, secret_access_key: "{LIMITED_SECRET}" }}
tenants:
  overrides:
    limited: {{ requests_per_minute: 1 }}
isolation: {{ salt_secret: "salt-secret-0123456789abcdef" }}"#
    )
}

/// A URL nothing listens on.
pub async fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

pub fn error_type(h: &HeaderMap) -> &str {
    h.get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Every frame of an event-stream body: (event or exception type, payload).
fn frames(mut body: &[u8]) -> Vec<(String, Bytes)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let len = u32::from_be_bytes(body[..4].try_into().unwrap()) as usize;
        let m = read_message_from(&body[..len]).unwrap();
        let kind = m
            .headers()
            .iter()
            .find(|h| matches!(h.name().as_str(), ":event-type" | ":exception-type"))
            .map(|h| h.value().as_string().unwrap().as_str().to_owned())
            .unwrap();
        out.push((kind, m.payload().clone()));
        body = &body[len..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_on_endpoints_routes_are_in_sagemakers_shape_and_openai_routes_keep_theirs() {
    let c = Container::start("c0").await;
    let down = closed_port().await;
    let gw = Gateway::start(&sagemaker_config(&[&c], &down, "")).await;
    let cases: Vec<super::BadInput> = vec![
        (
            "unknown endpoint",
            "/endpoints/nope/invocations",
            None,
            br#"{"inputs":"x"}"#.to_vec(),
            400,
            "ValidationError",
        ),
        (
            "malformed JSON",
            "/endpoints/chat/invocations",
            None,
            b"{\"inputs\":".to_vec(),
            400,
            "ValidationError",
        ),
        (
            "wrong content type",
            "/endpoints/chat/invocations",
            Some(("content-type", "text/csv")),
            b"a,b".to_vec(),
            400,
            "ValidationError",
        ),
        (
            "oversized body",
            "/endpoints/chat/invocations-response-stream",
            None,
            format!(r#"{{"inputs":"{}"}}"#, "a".repeat(70_000)).into_bytes(),
            400,
            "ValidationError",
        ),
        (
            "bad prefix-aware id",
            "/endpoints/chat/invocations",
            Some(("x-amzn-sagemaker-prefix-aware-id", "")),
            br#"{"inputs":"x"}"#.to_vec(),
            400,
            "ValidationError",
        ),
        (
            "upstream 500",
            "/endpoints/chat/invocations",
            None,
            br#"{"fail":500}"#.to_vec(),
            424,
            "ModelError",
        ),
        (
            "upstream 400 on the stream route",
            "/endpoints/chat/invocations-response-stream",
            None,
            br#"{"fail":400}"#.to_vec(),
            424,
            "ModelError",
        ),
        (
            "instance unreachable",
            "/endpoints/down/invocations",
            None,
            br#"{"inputs":"x"}"#.to_vec(),
            424,
            "ModelError",
        ),
        (
            "instance cooling down: none left",
            "/endpoints/down/invocations",
            None,
            br#"{"inputs":"x"}"#.to_vec(),
            503,
            "ServiceUnavailable",
        ),
        (
            "unknown route",
            "/endpoints/chat/nothing",
            None,
            b"{}".to_vec(),
            404,
            "UnknownOperationException",
        ),
    ];
    for (what, path, header, body, status, code) in cases {
        let mut req = client().post(gw.url(path)).body(body);
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{what}");
        assert_eq!(error_type(resp.headers()), code, "{what}");
        assert_eq!(resp.headers()["content-type"], "application/json", "{what}");
        assert!(resp.headers().contains_key("x-request-id"), "{what}");
        let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert!(v.get("error").is_none(), "{what}: {v}");
        if code == "ModelError" && what.starts_with("upstream") {
            let original = if what.contains("400") { 400 } else { 500 };
            assert_eq!(v["OriginalStatusCode"], original, "{what}: {v}");
            assert_eq!(v["OriginalMessage"], "boom", "{what}: {v}");
        }
    }
    // Only the two upstream failures reached the container.
    assert_eq!(c.bodies().len(), 2);
    // The OpenAI routes keep the OpenAI shape.
    let resp = gw
        .post(
            "/v1/chat/completions",
            &serde_json::json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(resp.status(), 404);
    assert!(!resp.headers().contains_key("x-amzn-errortype"));
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_stream_is_one_payload_part_per_chunk_with_nothing_added() {
    let c = Container::start("c0").await;
    let down = closed_port().await;
    // sse_keepalive_ms is 20: an SSE answer elsewhere would get pings while
    // the last part is held.
    let gw = Gateway::start(&sagemaker_config(&[&c], &down, "")).await;
    let resp = client()
        .post(gw.url("/endpoints/chat/invocations-response-stream"))
        .header("x-amzn-sagemaker-custom-attributes", "trace=1")
        .body(r#"{"inputs":"x","stream":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["content-type"], "application/vnd.amazon.eventstream");
    assert_eq!(h["x-amzn-sagemaker-content-type"], "text/event-stream");
    assert_eq!(h["x-amzn-invoked-production-variant"], "i0");
    assert_eq!(h["x-amzn-sagemaker-custom-attributes"], "seen=trace=1");
    assert_eq!(h["x-accel-buffering"], "no");
    let mut body = resp.bytes_stream();
    let mut got = Vec::new();
    use futures_util::StreamExt;
    // Read until parts 0-3 are in, then release the last one.
    while got.len() < 4 * 20 {
        let chunk = body.next().await.unwrap().unwrap();
        got.extend_from_slice(&chunk);
        let parts = frames_prefix(&got);
        if parts == 4 {
            break;
        }
    }
    client()
        .get(format!("{}/release", c.url()))
        .send()
        .await
        .unwrap();
    while let Some(chunk) = body.next().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    let frames = frames(&got);
    assert!(frames.iter().all(|(k, _)| k == "PayloadPart"), "{frames:?}");
    let payload: Vec<u8> = frames.iter().flat_map(|(_, p)| p.to_vec()).collect();
    assert_eq!(String::from_utf8(payload).unwrap(), PARTS.concat());
}

/// How many whole frames `buf` holds.
fn frames_prefix(mut buf: &[u8]) -> usize {
    let mut n = 0;
    while buf.len() >= 4 {
        let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
        if buf.len() < len {
            break;
        }
        buf = &buf[len..];
        n += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_off_ends_with_a_model_stream_error_event() {
    let c = Container::start("c0").await;
    let down = closed_port().await;
    let gw = Gateway::start(&sagemaker_config(&[&c], &down, "")).await;
    let resp = client()
        .post(gw.url("/endpoints/chat/invocations-response-stream"))
        .body(r#"{"inputs":"x","stream":true,"break":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut got = Vec::new();
    use futures_util::StreamExt;
    while frames_prefix(&got) < 1 {
        got.extend_from_slice(&body.next().await.unwrap().unwrap());
    }
    client()
        .get(format!("{}/release", c.url()))
        .send()
        .await
        .unwrap();
    while let Some(Ok(chunk)) = body.next().await {
        got.extend_from_slice(&chunk);
    }
    let frames = frames(&got);
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(
        frames[0],
        ("PayloadPart".to_owned(), Bytes::from_static(b"part-0 "))
    );
    assert_eq!(frames[1].0, "ModelStreamError");
    let v: serde_json::Value = serde_json::from_slice(&frames[1].1).unwrap();
    assert!(v["Message"].as_str().unwrap().contains("broke off"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_the_response_stream_cancels_the_upstream() {
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks: (0..50).map(|i| format!("data: {i}\n\n")).collect(),
            gap: Duration::from_millis(200),
        },
    )
    .await;
    let gw = Gateway::start(&config("m", &[&up], "prefix_aware", 10)).await;
    let resp = client()
        .post(gw.url("/endpoints/chat/invocations-response-stream"))
        .body(r#"{"inputs":"x"}"#)
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    use futures_util::StreamExt;
    body.next().await.unwrap().unwrap();
    drop(body);
    eventually("the upstream request cancelled", || up.cancelled() == 1).await;
    gw.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_sagemaker_runtime_interop() {
    let containers = [
        Container::start("i0").await,
        Container::start("i1").await,
        Container::start("i2").await,
    ];
    let refs: Vec<&Container> = containers.iter().collect();
    let down = closed_port().await;
    let gw = Gateway::start(&sagemaker_config(&refs, &down, &sigv4_auth())).await;
    let args = serde_json::json!({
        "base": format!("http://{}", gw.addr),
        "release": containers.iter().map(|c| format!("{}/release", c.url())).collect::<Vec<_>>(),
        "key": ACME_KEY, "secret": ACME_SECRET,
        "limited_key": LIMITED_KEY, "limited_secret": LIMITED_SECRET,
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/sdk/sagemaker_interop.py"
    );
    let out = tokio::process::Command::new("python3")
        .args([script, &args.to_string()])
        .env("NO_PROXY", "*")
        .output()
        .await
        .expect("python3 must be installed (.ci/run installs boto3: pip install -r tests/sdk/requirements.txt)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "boto3 interop failed (is boto3 installed? pip install -r tests/sdk/requirements.txt)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.starts_with("ok"), "{stdout}");
    // Nothing a refused request carried reached a container, and every
    // forwarded body had the tenant's cache salt set by the gateway.
    let bodies: Vec<String> = containers.iter().flat_map(Container::bodies).collect();
    assert!(!bodies.is_empty());
    assert!(
        bodies
            .iter()
            .all(|b| !b.to_ascii_lowercase().contains("must-not-arrive")),
        "{bodies:?}"
    );
    assert!(
        bodies.iter().all(|b| b.contains("\"cache_salt\"")),
        "{bodies:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_contract_at_the_root_serves_the_first_endpoint() {
    let c = Container::start("c0").await;
    let down = closed_port().await;
    let gw = Gateway::start(&sagemaker_config(&[&c], &down, "")).await;
    let ping = client().get(gw.url("/ping")).send().await.unwrap();
    assert_eq!(ping.status(), 200);
    let resp = client()
        .post(gw.url("/invocations"))
        .header("x-amzn-sagemaker-custom-attributes", "a=1")
        .body(r#"{"inputs":"from SageMaker"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-amzn-invoked-production-variant"], "i0");
    assert_eq!(
        resp.headers()["x-amzn-sagemaker-custom-attributes"],
        "seen=a=1"
    );
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["received"]["inputs"], "from SageMaker");
    let bad = client()
        .post(gw.url("/invocations"))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(error_type(bad.headers()), "ValidationError");
    assert_eq!(c.bodies().len(), 1);
}
