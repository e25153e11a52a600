//! Quotas: concurrency (held until the response ends or the client leaves),
//! requests per minute, and tokens per minute settled with the upstream's
//! reported usage. A refusal is a 429 with `retry-after` and `x-ratelimit-*`,
//! reaches no upstream, and leaves other tenants alone.

use futures_util::StreamExt;

use super::*;

async fn expect_429(resp: reqwest::Response, what: &str) -> u64 {
    assert_eq!(resp.status(), 429, "{what}");
    let retry: u64 = header(&resp, "retry-after").parse().unwrap();
    assert!(retry >= 1, "{what}: retry-after {retry}");
    assert!(
        resp.headers()
            .keys()
            .any(|k| k.as_str().starts_with("x-ratelimit-")),
        "{what}"
    );
    let v = error_body(resp, what).await;
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{what}: {v}");
    retry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_limited_until_a_client_leaves() {
    let up = Upstream::start("u0", Mode::Hold).await;
    let gw = Gateway::start(&jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    acme: { max_concurrency: 2 }\n",
    ))
    .await;
    let acme = hs256(&claims("acme"));
    let url = gw.url("/v1/chat/completions");
    let body = serde_json::to_vec(&small_chat("held")).unwrap();
    let held: Vec<_> = (0..2)
        .map(|_| {
            let req = client()
                .post(&url)
                .bearer_auth(&acme)
                .body(body.clone())
                .send();
            tokio::spawn(req)
        })
        .collect();
    eventually("both held requests reached the upstream", || up.hits() == 2).await;
    let resp = chat(&gw, &acme, &small_chat("third")).await;
    assert_eq!(header(&resp, "x-ratelimit-limit-concurrency"), "2");
    expect_429(resp, "third concurrent request").await;
    assert_eq!(up.hits(), 2, "the refused request was forwarded");
    // Another tenant is not affected.
    let other = tokio::spawn(
        client()
            .post(&url)
            .bearer_auth(hs256(&claims("beta")))
            .body(body.clone())
            .send(),
    );
    eventually("the other tenant reached the upstream", || up.hits() == 3).await;
    other.abort();
    // One client leaves: its slot frees and the next request is admitted.
    up.set_mode(Mode::Json);
    held[0].abort();
    let again = small_chat("again");
    until(
        "a slot to free",
        || chat(&gw, &acme, &again),
        |r| r.status() == 200,
    )
    .await;
    held[1].abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holds_its_slot_until_it_ends() {
    let chunks: Vec<String> = (0..4).map(|i| format!("data: {{\"n\":{i}}}\n\n")).collect();
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks,
            gap: Duration::from_millis(300),
        },
    )
    .await;
    let gw = Gateway::start(&jwt_config(
        &[&up],
        "tenants:\n  default: { max_concurrency: 1 }\n",
    ))
    .await;
    let acme = hs256(&claims("acme"));
    let resp = chat(&gw, &acme, &chat_body(MODEL, "s", "stream", true)).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let _first = body.next().await.unwrap().unwrap();
    expect_429(
        chat(&gw, &acme, &small_chat("while streaming")).await,
        "during a stream",
    )
    .await;
    while let Some(c) = body.next().await {
        c.unwrap();
    }
    up.set_mode(Mode::Json);
    let after = small_chat("after");
    until(
        "the stream's slot to free",
        || chat(&gw, &acme, &after),
        |r| r.status() == 200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_minute_are_limited() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    acme: { requests_per_minute: 2 }\n",
    ))
    .await;
    let acme = hs256(&claims("acme"));
    for left in ["1", "0"] {
        let resp = chat(&gw, &acme, &small_chat("q")).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-ratelimit-limit-requests"), "2");
        assert_eq!(header(&resp, "x-ratelimit-remaining-requests"), left);
    }
    let resp = chat(&gw, &acme, &small_chat("q")).await;
    assert_eq!(header(&resp, "x-ratelimit-remaining-requests"), "0");
    assert!(header(&resp, "x-ratelimit-reset-requests").ends_with('s'));
    let retry = expect_429(resp, "third request in a minute").await;
    assert!(retry <= 60, "retry-after {retry}");
    assert_eq!(up.hits(), 2);
    assert_eq!(
        chat(&gw, &hs256(&claims("beta")), &small_chat("q"))
            .await
            .status(),
        200
    );
}

fn usage_stream(prompt_tokens: u64) -> Mode {
    Mode::Stream {
        chunks: vec![
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n".into(),
            format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"prompt_tokens_details\":{{\"cached_tokens\":0}}}}}}\n\n"
            ),
            "data: [DONE]\n\n".into(),
        ],
        gap: Duration::from_millis(10),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_settled_with_the_reported_usage() {
    // The upstream reports 5,000 prompt tokens for a ~60-token estimate: the
    // tenant goes 4,000 into debt on a 1,000-a-minute quota.
    let up = Upstream::start("u0", usage_stream(5000)).await;
    let gw = Gateway::start(&jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    acme: { tokens_per_minute: 1000 }\n",
    ))
    .await;
    let acme = hs256(&claims("acme"));
    let resp = chat(&gw, &acme, &chat_body(MODEL, "s", "q", true)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-ratelimit-limit-tokens"), "1000");
    resp.bytes().await.unwrap();
    // Settlement happens as the body ends; poll rather than race it.
    let q = small_chat("q");
    let resp = until("a 429", || chat(&gw, &acme, &q), |r| r.status() == 429).await;
    assert_eq!(header(&resp, "x-ratelimit-remaining-tokens"), "0");
    let retry = expect_429(resp, "tokens in debt").await;
    // With only the estimate charged, the wait would be a few seconds at most.
    assert!(
        retry >= 120,
        "retry-after {retry}: reported usage was not charged"
    );
    assert_eq!(
        chat(&gw, &hs256(&claims("beta")), &small_chat("q"))
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_estimates_are_refunded() {
    // The upstream reports 10 prompt tokens; each ~3 KB body is estimated at ~750.
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&jwt_config(
        &[&up],
        "tenants:\n  default: { tokens_per_minute: 1000 }\n",
    ))
    .await;
    let acme = hs256(&claims("acme"));
    let big = chat_body(MODEL, &"x".repeat(2900), "q", false);
    assert_eq!(chat(&gw, &acme, &big).await.status(), 200);
    // Without the refund the bucket would hold ~250 for the next half minute.
    until(
        "the refund",
        || chat(&gw, &acme, &big),
        |r| r.status() == 200,
    )
    .await;
    // A body estimated above the whole quota waits for a full bucket.
    let huge = chat_body(MODEL, &"x".repeat(4400), "q", false);
    let resp = until("a 429", || chat(&gw, &acme, &huge), |r| r.status() == 429).await;
    let retry = expect_429(resp, "estimate above the quota").await;
    assert!(retry <= 60, "retry-after {retry}");
}

/// Send a head that expects `100 Continue`, and read until it comes: hyper
/// sends it when the body is first read, so by then the request is past
/// authentication and holds its slot.
async fn upload_started(addr: std::net::SocketAddr, token: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\nexpect: 100-continue\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before 100 Continue");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // One byte of body a while: an upload in progress.
    s.write_all(b"{").await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_hold_their_tenants_slots_before_the_body_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml = jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    acme: { max_concurrency: 2 }\n",
    )
    .replace(
        "  max_body_bytes: 65536\n",
        "  max_body_bytes: 65536\n  timeouts: { body_read_ms: 60000 }\n",
    );
    let gw = Gateway::start(&yaml).await;
    let acme = hs256(&claims("acme"));
    let mut uploads = vec![
        upload_started(gw.addr, &acme).await,
        upload_started(gw.addr, &acme).await,
    ];
    // A third: its head says 1000 bytes follow, none do. The answer comes
    // from the head alone (the body timeout is a minute away).
    let mut third = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {acme}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
    );
    third.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), third.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "the third upload was admitted to wait for its body"
    );
    let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 429"), "{text}");
    assert!(text.contains("x-ratelimit-limit-concurrency: 2"), "{text}");
    assert!(text.contains("\"code\":\"rate_limit_exceeded\""), "{text}");
    // Another tenant is not affected.
    let beta = chat(&gw, &hs256(&claims("beta")), &small_chat("beta")).await;
    assert_eq!(beta.status(), 200);
    // An upload that goes away frees its slot.
    drop(uploads.pop());
    let again = small_chat("again");
    until(
        "a slot to free",
        || chat(&gw, &acme, &again),
        |r| r.status() == 200,
    )
    .await;
    assert_eq!(
        up.hits(),
        2,
        "only beta's and the last request were forwarded"
    );
    uploads.clear();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_tokens_in_usage_count_against_tokens_per_minute() {
    // 10 prompt tokens and 5,000 completion tokens on a 1,000-a-minute quota:
    // only the completion puts the tenant 4,000 into debt.
    const BODY: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"long"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5000,"total_tokens":5010}}"#;
    let up = Upstream::start("u0", Mode::Raw(200, "application/json", BODY)).await;
    let gw = Gateway::start(&jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    acme: { tokens_per_minute: 1000 }\n",
    ))
    .await;
    let acme = hs256(&claims("acme"));
    let resp = chat(&gw, &acme, &small_chat("q")).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let q = small_chat("q");
    let resp = until("a 429", || chat(&gw, &acme, &q), |r| r.status() == 429).await;
    let retry = expect_429(resp, "completion tokens in debt").await;
    // Prompt tokens alone (10) would leave the bucket nearly full.
    assert!(
        retry >= 120,
        "retry-after {retry}: completion tokens not charged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_usage_is_charged_its_counted_completion_tokens() {
    let words = "The quick brown fox jumps over the lazy dog; naïve café owners \
                 count 12,345 tokens in 2026. ";
    let deltas: Vec<String> = words
        .repeat(60)
        .split_inclusive(' ')
        .map(str::to_owned)
        .collect();
    let text: String = deltas.concat();
    let want = tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(&text)
        .len() as u64;
    assert!(want > 1000, "{want}");
    let mut chunks: Vec<String> = deltas
        .chunks(7)
        .map(|d| {
            let content = serde_json::to_string(&d.concat()).unwrap();
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{content}}}}}]}}\n\n"
            )
        })
        .collect();
    chunks.push("data: [DONE]\n\n".into());
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks,
            gap: Duration::from_millis(1),
        },
    )
    .await;
    // Its own endpoint name, so no other test's streams add to its metric.
    let yaml = jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    acme: { tokens_per_minute: 600 }\n",
    )
    .replace("name: chat", "name: counting");
    let gw = Gateway::start(&yaml).await;
    let acme = hs256(&claims("acme"));
    let body = chat_body(MODEL, "s", "tell me", true);
    let estimate = (serde_json::to_vec(&body).unwrap().len() as u64).div_ceil(4);
    let resp = chat(&gw, &acme, &body).await;
    assert_eq!(resp.status(), 200);
    let streamed = resp.bytes().await.unwrap();
    assert!(streamed.ends_with(b"data: [DONE]\n\n"));
    let series = "kvgate_completion_tokens_total{endpoint=\"counting\",source=\"counted\"} ";
    let mut counted = None;
    for _ in 0..200 {
        let m = gw.metrics().await;
        counted = m
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .map(|v| v.parse::<u64>().unwrap());
        if counted.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        counted,
        Some(want),
        "counted tokens vs tiktoken's count of the text"
    );
    // The bucket: 600 - estimate, settled to 600 - (estimate + counted): in
    // debt by about `want`, refilling at 10 a second.
    let q = small_chat("q");
    let next = (serde_json::to_vec(&q).unwrap().len() as u64).div_ceil(4);
    let resp = chat(&gw, &acme, &q).await;
    let retry = expect_429(resp, "counted completion tokens in debt").await;
    let expected = (estimate + want + next).saturating_sub(600) / 10;
    assert!(
        retry.abs_diff(expected) <= 3,
        "retry-after {retry}, expected about {expected}"
    );
}
