//! Hostile input: each gets a 4xx (or the connection closed) and the gateway
//! keeps serving; nothing reaches an upstream.

use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// Auth on, a 1 MiB body cap (so nesting is refused for its depth, not its
/// size) and a 1 s header read timeout.
async fn hostile_gateway(up: &Upstream) -> Gateway {
    let yaml = jwt_config(&[up], "").replace(
        "  max_body_bytes: 65536\n",
        "  max_body_bytes: 1048576\n  timeouts: { header_read_ms: 1000 }\n",
    );
    Gateway::start(&yaml).await
}

async fn still_serving(gw: &Gateway, token: &str) {
    assert_eq!(
        chat(gw, token, &small_chat("still there?")).await.status(),
        200
    );
}

/// Write `request` (errors ignored: the server may hang up first) while
/// reading everything the server sends until it closes, for up to 10 s.
async fn exchange(gw: &Gateway, request: Vec<u8>) -> String {
    let (mut rd, mut wr) = TcpStream::connect(gw.addr).await.unwrap().into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
    writer.abort();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_get_a_4xx() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = hostile_gateway(&up).await;
    let t = hs256(&claims("acme"));
    let deep =
        |open: &str, close: &str| format!("{}{}", open.repeat(100_000), close.repeat(100_000));
    let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "100,000-deep arrays",
            "/endpoints/chat/invocations",
            deep("[", "]").into_bytes(),
        ),
        (
            "100,000-deep objects",
            "/endpoints/chat/invocations",
            deep("{\"a\":", "}").into_bytes(),
        ),
        (
            "100,000-deep, unterminated",
            "/v1/chat/completions",
            "[".repeat(100_000).into_bytes(),
        ),
        (
            "deep inside messages",
            "/v1/chat/completions",
            format!(r#"{{"model":"{MODEL}","messages":{}}}"#, deep("[", "]")).into_bytes(),
        ),
        (
            "10,000-digit number",
            "/v1/chat/completions",
            format!(
                r#"{{"model":"{MODEL}",{msgs},"seed":{}}}"#,
                "9".repeat(10_000)
            )
            .into_bytes(),
        ),
        (
            "number out of range",
            "/endpoints/chat/invocations",
            br#"{"inputs":1e999999}"#.to_vec(),
        ),
        (
            "duplicate keys",
            "/v1/chat/completions",
            format!(r#"{{"model":"{MODEL}",{msgs},{msgs}}}"#).into_bytes(),
        ),
        (
            "duplicate cache_salt",
            "/v1/chat/completions",
            format!(r#"{{"model":"{MODEL}",{msgs},"cache_salt":"a","cache_salt":"b"}}"#)
                .into_bytes(),
        ),
        (
            "invalid UTF-8",
            "/v1/chat/completions",
            [br#"{"model":""#.as_slice(), b"\xc3\x28", br#""}"#].concat(),
        ),
        (
            "lone surrogate",
            "/v1/completions",
            format!(r#"{{"model":"{MODEL}","prompt":"\udc00"}}"#).into_bytes(),
        ),
        (
            "lone surrogate in a key",
            "/endpoints/chat/invocations",
            br#"{"\ud800":1}"#.to_vec(),
        ),
    ];
    for (what, path, body) in cases {
        let resp = post(&gw, path, Some(&t), body).await;
        assert_eq!(resp.status(), 400, "{what}");
        if path.starts_with("/endpoints/") {
            assert_eq!(
                resp.headers()["x-amzn-errortype"],
                "ValidationError",
                "{what}"
            );
            continue;
        }
        let v = error_body(resp, what).await;
        assert_eq!(v["error"]["code"], "invalid_json", "{what}: {v}");
    }
    assert_eq!(up.hits(), 0);
    still_serving(&gw, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_megabyte_body_is_refused() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = hostile_gateway(&up).await;
    let t = hs256(&claims("acme"));
    // Declared: refused before a byte of it is read.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {t}\r\ncontent-type: application/json\r\ncontent-length: 104857600\r\n\r\n{{"
    );
    let text = exchange(&gw, head.into_bytes()).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    // Streamed, undeclared: cut off at the cap, not buffered.
    let chunks = futures_util::stream::iter(
        (0..1600).map(|_| Ok::<_, std::io::Error>(vec![b' '; 64 * 1024])),
    );
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&t)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    if let Ok(resp) = resp {
        assert_eq!(resp.status(), 413);
    }
    assert_eq!(up.hits(), 0);
    still_serving(&gw, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_header_gets_431() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = hostile_gateway(&up).await;
    let t = hs256(&claims("acme"));
    let req = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let text = exchange(&gw, req.into_bytes()).await;
    assert!(
        text.starts_with("HTTP/1.1 431"),
        "{:?}",
        &text[..text.len().min(200)]
    );
    // In the error shape, not hyper's empty body.
    assert!(
        text.contains(r#""code":"request_header_fields_too_large""#),
        "{text}"
    );
    // A megabyte of bearer token is refused the same way, before auth runs.
    let req = format!(
        "GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    assert!(
        exchange(&gw, req.into_bytes())
            .await
            .starts_with("HTTP/1.1 431")
    );
    still_serving(&gw, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = hostile_gateway(&up).await;
    let t = hs256(&claims("acme"));
    // (what, sent at once, then sent one byte every 250 ms: a slowloris, four
    // times faster than usual so the test is short).
    let slow: [(&str, &[u8], &[u8]); 4] = [
        (
            "HTTP/1.1 head",
            b"",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaaaaaaaa",
        ),
        (
            "HTTP/2 preface",
            b"",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0",
        ),
        ("nothing at all", b"", b""),
        // Keep-alive: one good request, then a slow second head.
        (
            "keep-alive head",
            b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
            b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaa",
        ),
    ];
    for (what, fast, bytes) in slow {
        let started = Instant::now();
        let (mut rd, mut wr) = TcpStream::connect(gw.addr).await.unwrap().into_split();
        let (fast, bytes) = (fast.to_vec(), bytes.to_vec());
        let writer = tokio::spawn(async move {
            if wr.write_all(&fast).await.is_err() {
                return;
            }
            for b in bytes {
                if wr.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        // Others are served meanwhile.
        still_serving(&gw, &t).await;
        let mut out = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
        writer.abort();
        assert!(closed.is_ok(), "{what}: connection still open after 10 s");
        let text = String::from_utf8_lossy(&out);
        // At most the keep-alive case's first answer, then a 408 or nothing.
        let rest = text
            .split_once("\r\n\r\n{\"status\":\"ok\"}")
            .map_or(&*text, |(_, r)| r);
        // A head that began gets its 408 in the error shape; a connection
        // that sent no request (or an HTTP/2 preface) is just closed.
        if what.ends_with("head") {
            assert!(rest.starts_with("HTTP/1.1 408"), "{what}: {text}");
            assert!(
                rest.contains(r#""code":"request_timeout""#),
                "{what}: {text}"
            );
        } else {
            assert!(rest.is_empty(), "{what}: {text}");
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
    }
    assert_eq!(up.hits(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_is_not_mistaken_for_a_slow_client() {
    // The header timeout (1 s) bounds the client's head, not the answer.
    let up = Upstream::start("u0", Mode::Delay(Duration::from_millis(2500))).await;
    let gw = hostile_gateway(&up).await;
    let t = hs256(&claims("acme"));
    still_serving(&gw, &t).await;
    let chunks: Vec<String> = (0..4).map(|i| format!("data: {i}\n\n")).collect();
    up.set_mode(Mode::Stream {
        chunks: chunks.clone(),
        gap: Duration::from_millis(800),
    });
    let resp = chat(&gw, &t, &chat_body(MODEL, "s", "q", true)).await;
    assert_eq!(resp.bytes().await.unwrap(), chunks.concat().as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_the_rfcs_forbid_is_a_400() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = hostile_gateway(&up).await;
    let t = hs256(&claims("acme"));
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    let cases = [
        (
            "gzip, chunked",
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {t}\r\ntransfer-encoding: gzip, chunked\r\n\r\n{chunked}"
            ),
        ),
        (
            "no Host",
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nauthorization: Bearer {t}\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ),
        ),
        (
            "two Hosts",
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nhost: y\r\nauthorization: Bearer {t}\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ),
        ),
    ];
    for (what, req) in cases {
        let text = exchange(&gw, req.into_bytes()).await;
        assert!(text.starts_with("HTTP/1.1 400"), "{what}: {text}");
        assert!(
            text.contains("\"code\":\"invalid_request\""),
            "{what}: {text}"
        );
    }
    assert_eq!(up.hits(), 0, "a badly framed request was forwarded");
    still_serving(&gw, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_framing_cannot_smuggle_a_request() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = hostile_gateway(&up).await;
    let t = hs256(&claims("acme"));
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    // A transfer-encoding other than chunked, with a length: refused.
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {t}\r\ntransfer-encoding: gzip\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    assert!(
        exchange(&gw, req.into_bytes())
            .await
            .starts_with("HTTP/1.1 400")
    );
    // Both framings, with a second request hidden after the chunked body. The
    // body is read as chunked (RFC 9112 §6.3) and the connection is closed
    // after the answer, so the hidden request is never served.
    for order in [
        "content-length: 4\r\ntransfer-encoding: chunked",
        "transfer-encoding: chunked\r\ncontent-length: 4",
    ] {
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {t}\r\n{order}\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {t}\r\n\r\n",
            body.len()
        );
        let text = exchange(&gw, req.into_bytes()).await;
        assert!(
            text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.1 400"),
            "{text}"
        );
        assert_eq!(
            text.matches("HTTP/1.1 ").count(),
            1,
            "the hidden request was answered: {text}"
        );
        assert!(!text.contains("\"object\":\"list\""), "{text}");
    }
    still_serving(&gw, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_big_body_is_drained_so_the_client_sees_the_401() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = hostile_gateway(&up).await;
    for (what, auth) in [
        ("no credentials", String::new()),
        (
            "a forged token",
            "authorization: Bearer not.a.token\r\n".to_owned(),
        ),
    ] {
        // Write the head and all 8 MiB, then read: as Python's http.client does.
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        let len = 8 << 20;
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let sent =
            tokio::time::timeout(Duration::from_secs(20), s.write_all(&vec![b' '; len])).await;
        let sent = sent
            .unwrap_or_else(|_| panic!("{what}: the gateway stopped reading and did not close"));
        sent.unwrap_or_else(|e| {
            panic!("{what}: writing the body failed ({e}): closed without draining")
        });
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 401"), "{what}: {text}");
        assert!(text.contains("connection: close"), "{what}: {text}");
        assert!(
            text.contains(r#""code":"invalid_api_key""#),
            "{what}: {text}"
        );
    }
    assert_eq!(up.hits(), 0);
}
