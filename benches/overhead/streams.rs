//! The open-stream memory test: an in-process upstream that answers
//! `stream: true` with one SSE event and holds the stream open until
//! released (other requests get the fixed answer at once), and a client that
//! opens N such streams through a proxy over HTTP/2 and reads the proxy's RSS.

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::routing::post;
use tokio::sync::watch;

/// The held-open SSE upstream; its streams end when `release` changes.
pub async fn start_upstream(release: watch::Receiver<u64>) -> u16 {
    // A backlog for 10,000 streams' connections opening at once (tokio's
    // default of 1,024 drops SYNs, and the proxy's connects time out).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = socket.listen(4096).unwrap();
    let port = l.local_addr().unwrap().port();
    let answer = move |body: Bytes| {
        let mut release = release.clone();
        // Only a release after this request began ends it.
        release.borrow_and_update();
        async move {
            if memchr::memmem::find(&body, br#""stream":true"#).is_none() {
                return axum::response::Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from(super::configs::ANSWER))
                    .unwrap();
            }
            let first = futures_util::stream::once(async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"data: {\"choices\":[]}\n\n"))
            });
            let held = futures_util::stream::once(async move {
                release.changed().await.ok();
                Ok(Bytes::from_static(b"data: [DONE]\n\n"))
            });
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(futures_util::StreamExt::chain(
                    first, held,
                )))
                .unwrap()
        }
    };
    tokio::spawn(async move {
        axum::serve(l, Router::new().route("/v1/chat/completions", post(answer)))
            .await
            .unwrap();
    });
    port
}

/// Opens `n` streams to `port` over HTTP/2, about 100 a connection as an
/// ingress multiplexes them, waits for each one's first event, and returns
/// `rss()` read while all are open. The caller releases them afterwards.
pub async fn rss_with_streams(port: u16, n: usize, rss: impl Fn() -> u64) -> u64 {
    let per_conn = 100;
    let clients: Vec<_> = (0..n.div_ceil(per_conn))
        .map(|_| {
            reqwest::Client::builder()
                .http2_prior_knowledge()
                .build()
                .unwrap()
        })
        .collect();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":4096,"stream":true}"#;
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let pending: Vec<_> = (0..n)
        .map(|i| {
            let (c, u) = (clients[i / per_conn].clone(), url.clone());
            tokio::spawn(async move {
                let mut r = c
                    .post(u)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "stream refused: {}", r.status());
                r.chunk().await.unwrap();
                r
            })
        })
        .collect();
    let mut held = Vec::with_capacity(n);
    for p in pending {
        held.push(p.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kib = rss();
    drop(held);
    kib
}
