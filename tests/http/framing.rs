//! Raw HTTP/1 a client library would never send, against the real gateway:
//! what hyper used to answer with an empty body (or a silent close) now comes
//! in the error shape, with `connection: close`; bodies refused unread are
//! drained so the client sees the status; the connection cap and the idle
//! timeout hold.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// A gateway over `up` with these lines added under `server:`.
pub async fn gateway_with(up: &Upstream, server_lines: &str) -> Gateway {
    let yaml = config(MODEL, &[up], "prefix_aware", 10).replace(
        "  failover_cooldown_ms: 60000\n",
        &format!("  failover_cooldown_ms: 60000\n{server_lines}"),
    );
    Gateway::start(&yaml).await
}

/// Write `request` (errors ignored: the server may hang up first) while
/// reading everything the server sends until it closes, for up to 10 s.
pub async fn exchange(addr: std::net::SocketAddr, request: Vec<u8>) -> String {
    let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the gateway kept the connection open");
    writer.abort();
    String::from_utf8_lossy(&out).into_owned()
}

/// The status, lower-cased head and JSON body of the first response in `text`.
fn response(text: &str) -> (u16, String, serde_json::Value) {
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head: {text}"));
    let status = head[9..12].parse().unwrap();
    let head = head.to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(rest.len());
    let body = serde_json::from_str(&rest[..len.min(rest.len())]).unwrap_or_default();
    (status, head, body)
}

/// An error in OpenAI's shape, on a connection the gateway then closes.
fn assert_error(text: &str, status: u16, code: &str) {
    let (got, head, body) = response(text);
    assert_eq!(got, status, "{text}");
    assert!(head.contains("content-type: application/json"), "{text}");
    assert!(head.contains("connection: close"), "{text}");
    assert!(head.contains("x-request-id: "), "{text}");
    assert_eq!(body["error"]["code"], code, "{text}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{text}"
    );
    assert!(body["error"]["type"].is_string(), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_hyper_refused_with_an_empty_body_get_the_error_shape() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(&up, "").await;
    let post = |headers: &str| {
        format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}\r\n{{}}").into_bytes()
    };
    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("two content-lengths", post("content-length: 2\r\ncontent-length: 2\r\n"), 400, "invalid_request"),
        ("content-length and chunked", post("content-length: 2\r\ntransfer-encoding: chunked\r\n"), 400, "invalid_request"),
        ("a bad content-length", post("content-length: 2, 2\r\n"), 400, "invalid_request"),
        ("a header line without a colon", post("content-length: 2\r\nno colon here\r\n"), 400, "invalid_request"),
        ("150 headers", post(&format!("content-length: 2\r\n{many}")), 431, "request_header_fields_too_large"),
        ("a 100 KiB header", post(&format!("content-length: 2\r\nx-big: {}\r\n", "a".repeat(100 << 10))), 431, "request_header_fields_too_large"),
        (
            "a 20 KiB target",
            format!("GET /v1/models?{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(20 << 10)).into_bytes(),
            414,
            "uri_too_long",
        ),
        (
            "a path that is not UTF-8",
            b"POST /v1/%ff/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "a SageMaker path that is not UTF-8",
            b"POST /endpoints/%ff/invocations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
            400,
            "ValidationError",
        ),
    ];
    for (what, request, status, code) in cases {
        let text = exchange(gw.addr, request).await;
        let (got, head, body) = response(&text);
        assert_eq!(got, status, "{what}: {text}");
        assert!(
            head.contains("content-type: application/json"),
            "{what}: {text}"
        );
        assert!(head.contains("x-request-id: "), "{what}: {text}");
        if code == "ValidationError" {
            // SageMaker's wire: the code in x-amzn-ErrorType, a bare message.
            assert!(
                head.contains("x-amzn-errortype: validationerror"),
                "{what}: {text}"
            );
            assert!(body["message"].is_string(), "{what}: {text}");
        } else {
            assert_eq!(body["error"]["code"], code, "{what}: {text}");
        }
    }
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_size_followed_by_a_space_is_a_400() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(&up, "").await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let chunked = |size_line: String| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{size_line}\r\n{body}\r\n0\r\n\r\n"
        )
        .into_bytes()
    };
    for bad in [format!("{:x} ", body.len()), format!("{:x}\t", body.len())] {
        let text = exchange(gw.addr, chunked(bad.clone())).await;
        assert_error(&text, 400, "invalid_request");
        assert!(text.contains("chunk"), "{bad:?}: {text}");
    }
    assert_eq!(up.hits(), 0);
    // An extension (with the whitespace RFC 9112 allows before `;`) is fine.
    let text = exchange(gw.addr, chunked(format!("{:x} ;ext=1", body.len()))).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_gets_a_408_in_the_error_shape() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(&up, "  timeouts: { header_read_ms: 500 }\n").await;
    let head =
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n";
    let trickle = |addr| async move {
        let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        let writer = tokio::spawn(async move {
            for b in head.iter().cycle().take(200) {
                if wr.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
        writer.abort();
        assert!(read.is_ok(), "a trickled head held its connection");
        String::from_utf8_lossy(&out).into_owned()
    };
    let all: Vec<_> = (0..50).map(|_| tokio::spawn(trickle(gw.addr))).collect();
    for t in all {
        assert_error(&t.await.unwrap(), 408, "request_timeout");
    }
    // A keep-alive connection's second head is on the same clock.
    let (mut rd, mut wr) = TcpStream::connect(gw.addr).await.unwrap().into_split();
    wr.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /health HT")
        .await
        .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
    assert!(read.is_ok());
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let second = &text[text
        .find("HTTP/1.1 408")
        .unwrap_or_else(|| panic!("{text}"))..];
    assert_error(second, 408, "request_timeout");
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_before_a_refused_head_are_answered_first() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(&up, "").await;
    let text = exchange(
        gw.addr,
        b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /ready HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\nx".to_vec(),
    )
    .await;
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &text[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "200", "400"], "{text}");
    let last = &text[text.rfind("HTTP/1.1 400").unwrap()..];
    assert_error(last, 400, "invalid_request");
}

/// Write the head and the whole body, then read the answer: what Python's
/// `http.client` and many other clients do.
async fn send_all_then_read(addr: std::net::SocketAddr, head: String, body_len: usize) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let body = vec![b' '; body_len];
    let sent = tokio::time::timeout(Duration::from_secs(20), s.write_all(&body)).await;
    let sent = sent.expect("the gateway stopped reading and did not close");
    sent.unwrap_or_else(|e| {
        panic!("writing the body failed ({e}): the gateway closed without draining")
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_drained_so_the_client_sees_the_413() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(&up, "").await;
    let eight_mib = 8 << 20;
    // Declared: refused from the head, the body never read by the service.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {eight_mib}\r\n\r\n"
    );
    let text = send_all_then_read(gw.addr, head, eight_mib).await;
    assert_error(&text, 413, "payload_too_large");
    // Chunked: cut off at the cap mid-body.
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n800000\r\n".to_owned();
    let text = send_all_then_read(gw.addr, head, eight_mib).await;
    assert_error(&text, 413, "payload_too_large");
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed_after_client_idle_ms() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(&up, "  timeouts: { client_idle_ms: 500 }\n").await;
    let addr = gw.addr;
    let started = Instant::now();
    let all: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                    .await
                    .unwrap();
                let mut out = Vec::new();
                let read =
                    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
                assert!(read.is_ok(), "an idle keep-alive connection stayed open");
                String::from_utf8_lossy(&out).into_owned()
            })
        })
        .collect();
    for t in all {
        let text = t.await.unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(
            !text.to_ascii_lowercase().contains("connection: close"),
            "kept alive, then closed: {text}"
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(400));
}

/// Send `GET /health` and read until its answer's head is in.
async fn health_on(s: &mut TcpStream) {
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_new_ones_wait_for_a_free_slot() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(&up, "  max_connections: 2\n").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        health_on(&mut s).await;
        held.push(s);
    }
    let url = gw.url("/health");
    let third =
        tokio::spawn(async move { client().get(url).send().await.map(|r| r.status().as_u16()) });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past max_connections: 2"
    );
    drop(held.pop());
    let status = tokio::time::timeout(Duration::from_secs(10), third).await;
    assert_eq!(
        status.unwrap().unwrap().unwrap(),
        200,
        "the waiting connection was not served"
    );
}
