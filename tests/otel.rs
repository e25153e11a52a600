//! OpenTelemetry: with a collector configured, each request's span reaches a
//! real OTLP/HTTP receiver (POST /v1/traces, protobuf), the upstream gets a
//! W3C `traceparent` of the same trace, and a client's own trace is continued.
//!
//! A binary of its own: the subscriber, tracing's callsite interest and the
//! traces switch are process-wide.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

#[path = "common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::HeaderMap;
use tracing_subscriber::layer::SubscriberExt as _;

use common::*;

const MODEL: &str = "test-model";

/// A tiny OTLP/HTTP collector: keeps every POST /v1/traces body.
async fn collector() -> (String, Arc<Mutex<Vec<(HeaderMap, Bytes)>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let keep = Arc::clone(&keep);
            async move {
                keep.lock().unwrap().push((headers, body));
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

// The process's global subscriber, as `kvgate serve` installs one: the
// gateway serves requests on its own connection worker threads.
#[tokio::test]
async fn spans_reach_an_otlp_collector_and_the_upstream_gets_a_traceparent() {
    let (url, got) = collector().await;
    let (layer, guard) = kvgate::telemetry::otel::layer(&url).unwrap();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    guard.enable();
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    assert_eq!(
        gw.chat(&chat_body(MODEL, "s", "q", false)).await.status(),
        200
    );
    // A client in a trace of its own: the gateway's span is its child.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header(
            "traceparent",
            format!("00-{client_trace}-00f067aa0ba902b7-01"),
        )
        .body(serde_json::to_vec(&chat_body(MODEL, "s", "q2", false)).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = up.seen();
    let parents: Vec<String> = seen
        .iter()
        .map(|s| match s.headers.get("traceparent") {
            Some(v) => v.to_str().unwrap().to_owned(),
            None => panic!("no traceparent upstream: {:?} of {}", s.headers, seen.len()),
        })
        .collect();
    for p in &parents {
        let parts: Vec<&str> = p.split('-').collect();
        assert_eq!(
            (parts.len(), parts[0], parts[1].len(), parts[2].len()),
            (4, "00", 32, 16),
            "{p}"
        );
    }
    assert_ne!(parents[0].split('-').nth(1), Some(client_trace));
    assert_eq!(
        parents[1].split('-').nth(1),
        Some(client_trace),
        "the client's trace goes on"
    );
    assert_ne!(
        parents[1].split('-').nth(2),
        Some("00f067aa0ba902b7"),
        "under the gateway's own span"
    );
    // Flushing blocks until the collector (on this thread) has answered.
    tokio::task::spawn_blocking(move || drop(guard))
        .await
        .unwrap();
    let got = got.lock().unwrap();
    assert!(!got.is_empty(), "no spans exported");
    let (headers, body) = &got[0];
    assert_eq!(headers["content-type"], "application/x-protobuf");
    let all: Vec<u8> = got.iter().flat_map(|(_, b)| b.to_vec()).collect();
    let trace = hex::decode(parents[0].split('-').nth(1).unwrap()).unwrap();
    assert!(
        all.windows(16).any(|w| w == trace),
        "the upstream's trace id is in the export"
    );
    assert!(all.windows(7).any(|w| w == b"request") && !body.is_empty());
    assert!(all.windows(6).any(|w| w == b"kvgate"), "service name");
}
