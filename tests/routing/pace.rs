//! An instance's pace learned from its streamed first tokens (`kvgate_routing::
//! pace`), over real HTTP and SSE: in front of an engine that prefills one
//! request after another, each taking a fixed step plus its tokens at a fixed
//! rate, the gateway learns that step (in prefill tokens: the overhead each
//! queued request is charged) and the rate within a few dozen answers, shows
//! them in `explain`, and charges queued requests the learned overhead in
//! place of the 256-token guess. Answers that are not streamed teach nothing.
//! Before the fit stands, an engine that streams its answers token by token
//! is read after two answers: the gap between its tokens (a step) times the
//! prefill rate its first tokens show.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::common::*;

const MODEL: &str = "pace-model";
/// The engine's step, and its prefill rate (tokens a second).
const STEP: Duration = Duration::from_millis(200);
const RATE: f64 = 2_500.0;
/// What the gateway should learn: each request ahead delays a first token
/// by its step, less the [`GAP`] it was sent before (160 ms × 2,500 a second).
const OVERHEAD: f64 = 400.0;
/// Between the requests of a burst, so they reach the engine in order.
const GAP: Duration = Duration::from_millis(40);

/// A one-at-a-time engine: a request's first token comes once every request
/// before it and its own are done, each taking [`STEP`] + its tokens (4
/// characters each, the gateway's first guess too) at [`RATE`].
async fn engine() -> String {
    engine_with(STEP, 0).await
}

/// [`engine`] with its own fixed cost `step` a request, and `tokens` tokens
/// after the first, [`DECODE`] apart.
async fn engine_with(step: Duration, tokens: u32) -> String {
    engine_counting(step, tokens, 4.0, false).await
}

/// [`engine_with`] whose tokens are `chars_per_token` characters each, and
/// whose streams end with a `usage` chunk (as vLLM's do when the client asks
/// for `stream_options.include_usage`) if `usage`.
async fn engine_counting(step: Duration, tokens: u32, chars_per_token: f64, usage: bool) -> String {
    let busy_until = Arc::new(Mutex::new(Instant::now()));
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(
                move |State(busy): State<Arc<Mutex<Instant>>>, body: Bytes| async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                    let chars = v["messages"][0]["content"].as_str().map_or(0, str::len);
                    let prompt = (chars as f64 / chars_per_token).round() as u64;
                    let own = step + Duration::from_secs_f64(prompt as f64 / RATE);
                    let first_token = {
                        let mut b = busy.lock().await;
                        *b = (*b).max(Instant::now()) + own;
                        *b
                    };
                    let stream = v["stream"] == true;
                    let usage = (usage && stream).then(|| {
                        let u = json!({"id": "x", "object": "chat.completion.chunk", "choices": [],
                            "usage": {"prompt_tokens": prompt, "completion_tokens": tokens + 1,
                                "prompt_tokens_details": {"cached_tokens": 0}}});
                        Bytes::from(format!("data: {u}\n\ndata: [DONE]\n\n"))
                    });
                    let chunks = async_stream(first_token, stream, tokens, usage);
                    Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(Body::from_stream(chunks))
                        .unwrap()
                },
            ),
        )
        .with_state(busy_until);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The gap between the tokens of [`engine_with`]'s answers.
const DECODE: Duration = Duration::from_millis(50);

const CHUNK: &str = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\n\n";

/// The first token at `at`, `tokens` more [`DECODE`] apart, then the end of
/// the stream (`end` in place of `[DONE]` where given; or one JSON answer).
fn async_stream(
    at: Instant,
    stream: bool,
    tokens: u32,
    end: Option<Bytes>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    let end = end.unwrap_or(Bytes::from_static(b"data: [DONE]\n\n"));
    let end_first = end.clone();
    let first = futures_util::stream::once(async move {
        tokio::time::sleep_until(at).await;
        let text = if !stream {
            json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}).to_string()
        } else if tokens == 0 {
            return Ok([CHUNK.as_bytes(), &end_first].concat().into());
        } else {
            CHUNK.to_owned()
        };
        Ok(Bytes::from(text))
    });
    let rest = futures_util::stream::iter((1..=tokens).filter(move |_| stream)).then(move |k| {
        let end = end.clone();
        async move {
            tokio::time::sleep_until(at + DECODE * k).await;
            let end: &[u8] = if k == tokens { &end } else { b"" };
            Ok([CHUNK.as_bytes(), end].concat().into())
        }
    });
    first.chain(rest)
}

fn yaml(url: &str) -> String {
    format!(
        "endpoints:\n  - name: pace\n    models: [\"{MODEL}\"]\n    instances:\n      - {{ id: \"e0\", url: \"{url}\" }}\n    routing:\n      strategy: longest_prefix\n"
    )
}

/// A unique prompt of `tokens` tokens (4 characters each).
fn body(i: usize, tokens: usize, stream: bool) -> Value {
    let mut t = format!("{i:08} ");
    while t.len() < tokens * 4 {
        t.push_str(&format!("w{} ", t.len() * 7919 % 10_007));
    }
    t.truncate(tokens * 4);
    json!({"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": t}]})
}

/// `clients` clients each send `each` requests of varied sizes, back to back.
async fn closed_loop(gw: &Gateway, clients: usize, each: usize) {
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let url = gw.url("/v1/chat/completions");
            tokio::spawn(async move {
                for k in 0..each {
                    let r = post(&url, &body(c * 1000 + k, 500, false)).await;
                    assert_eq!(r.status(), 200);
                    r.bytes().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// `bursts` bursts of 1 to 4 streamed requests of varied sizes, sent [`GAP`]
/// apart onto an idle engine, so each finds the ones before it queued whole.
async fn bursts(gw: &Gateway, bursts: usize, before: usize) -> usize {
    let mut sent = 0;
    for b in 0..bursts {
        let mut tasks = Vec::new();
        for _ in 0..1 + (b * 7) % 4 {
            sent += 1;
            // 100 to 1,500 tokens: 5 to 75 ms of prefill. Unique prompts:
            // this engine caches nothing.
            let i = 100_000 + before + sent;
            let body = body(i, 100 + (i * 7919) % 15 * 100, true);
            let url = gw.url("/v1/chat/completions");
            tasks.push(tokio::spawn(async move {
                let r = post(&url, &body).await;
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
            }));
            tokio::time::sleep(GAP).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    sent
}

async fn post(url: &str, b: &Value) -> reqwest::Response {
    client()
        .post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(b).unwrap())
        .send()
        .await
        .unwrap()
}

/// Send `b` and read its whole answer, which must be a 200.
async fn answered(url: &str, b: &Value) {
    let r = post(url, b).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// The pace, which must be the first answers' reading.
async fn first_reading(gw: &Gateway) -> Value {
    let p = pace(gw).await;
    eprintln!("first reading: {p}");
    assert_eq!(
        p["source"], "first answers (gap between tokens × prefill rate)",
        "{p}"
    );
    p
}

async fn pace(gw: &Gateway) -> Value {
    let v = super::cache_aware::explain(gw, None, &body(99_999, 500, true)).await;
    v["instances"][0]["pace"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_learns_an_engines_step_and_rate_from_its_first_tokens() {
    let gw = Gateway::start(&yaml(&engine().await)).await;
    let p = pace(&gw).await;
    assert_eq!(p["source"], "default (256 tokens a request)", "{p}");
    assert_eq!(p["overhead_tokens"], 256, "{p}");

    // Not streamed: the first byte is the last, no sample.
    closed_loop(&gw, 3, 4).await;
    assert_eq!(pace(&gw).await["answers"], 0);

    // Streamed, 0 to 3 requests queued ahead of each, until the fit is
    // known well enough to use (a few dozen answers; more on a busy host).
    let mut sent = 0;
    for _ in 0..12 {
        sent += bursts(&gw, 4, sent).await;
        if pace(&gw).await["source"] != "default (256 tokens a request)" {
            break;
        }
    }
    let p = pace(&gw).await;
    eprintln!("learned pace: {p}");
    assert_eq!(p["source"], "learned from streamed first tokens", "{p}");
    assert_eq!(p["answers"], sent, "{p}");
    let overhead = p["overhead_tokens"].as_f64().unwrap();
    let rate = p["tokens_per_s"].as_f64().unwrap();
    let step = p["step_ms"].as_f64().unwrap();
    // Generous bounds: sleeps on a shared 2-core machine overshoot, and a
    // gateway busy with the burst's other requests claims some of them
    // late, which (as for any fit whose inputs are noisy) pulls the step
    // toward zero: learned values sit up to 2x low on a loaded host.
    assert!(
        (OVERHEAD * 0.4..=OVERHEAD * 2.0).contains(&overhead),
        "overhead {overhead} against {OVERHEAD}: {p}"
    );
    assert!(
        (RATE * 0.6..=RATE * 1.6).contains(&rate),
        "rate {rate} against {RATE}: {p}"
    );
    // Each request ahead: its step, less the gap it was sent earlier.
    assert!((64.0..=320.0).contains(&step), "step {step} ms: {p}");
    assert_eq!(
        p["running_weight_tokens"].as_u64().unwrap(),
        overhead as u64 / 8,
        "{p}"
    );

    // A queued request is charged the learned overhead, not the guess.
    let rt = gw.state.runtime.load_full();
    let inst = &rt.endpoint("pace").unwrap().instances[0];
    let queued_before = inst.queued_prefill();
    assert_eq!(queued_before, 0);
    let url = gw.url("/v1/chat/completions");
    // 1,500 tokens: queued for 800 ms.
    let b = body(77_777, 1500, true);
    let pending = tokio::spawn(async move { post(&url, &b).await });
    eventually("the request is queued", || inst.queued_prefill() > 0).await;
    let charged = inst.queued_prefill();
    assert!(
        charged.abs_diff(1500 + overhead as u64) <= 32,
        "charged {charged} for 1,500 tokens + {overhead}"
    );
    assert_eq!(pending.await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streamed_answers_give_a_first_reading_of_step_times_rate() {
    // No fixed cost a request: an unqueued first token is its prefill alone,
    // and each later token comes one decode step after the one before.
    let gw = Gateway::start(&yaml(&engine_with(Duration::ZERO, 12).await)).await;
    let url = gw.url("/v1/chat/completions");
    for (i, stream) in [(1, false), (2, true)] {
        answered(&url, &body(i, 1000, stream)).await;
    }
    let p = pace(&gw).await;
    assert_eq!(
        p["source"], "default (256 tokens a request)",
        "one gap: {p}"
    );
    assert_eq!(
        (p["answers"].as_u64(), p["gaps"].as_u64()),
        (Some(1), Some(1)),
        "{p}"
    );

    answered(&url, &body(3, 1000, true)).await;
    let p = first_reading(&gw).await;
    assert_eq!(p["gaps"], 2, "{p}");
    // 50 ms steps × 2,500 tokens a second = 125 tokens a queued request, in
    // place of 256. Bounds for a shared host: late sleeps lengthen both the
    // gap and the first token (lowering the rate the product rests on).
    let step = p["step_ms"].as_f64().unwrap();
    let rate = p["tokens_per_s"].as_f64().unwrap();
    let overhead = p["overhead_tokens"].as_f64().unwrap();
    assert!((45.0..=90.0).contains(&step), "step {step} ms: {p}");
    assert!(
        (RATE * 0.5..=RATE * 1.1).contains(&rate),
        "rate {rate}: {p}"
    );
    assert!(
        (60.0..=200.0).contains(&overhead),
        "overhead {overhead}: {p}"
    );

    // What routing charges a queued request follows at once…
    let rt = gw.state.runtime.load_full();
    let inst = &rt.endpoint("pace").unwrap().instances[0];
    let b = body(4, 1500, true);
    let pending = tokio::spawn(async move { post(&url, &b).await });
    eventually("the request is queued", || inst.queued_prefill() > 0).await;
    let charged = inst.queued_prefill();
    let full = 1500 + overhead as u64;
    // (less what drained between the claim and this look: a few ms' worth)
    assert!(
        charged <= full + 32 && charged + 150 >= full,
        "charged {charged} for 1,500 tokens + {overhead}"
    );
    // …and drains at the rate read while the engine prefills it (0.6 s at
    // 2,500 a second): 300 ms later, 375–825 tokens less at the bounds the
    // rate may read, or all of it if the first token came meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = inst.queued_prefill();
    assert!(
        later + 300 <= charged,
        "charged {charged}, 300 ms later {later} at {rate} tokens/s"
    );
    assert_eq!(pending.await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_reading_counts_prefill_in_the_engines_own_tokens() {
    // An engine of 2 characters a token, not the 4 the gateway guesses
    // before its answers have taught it otherwise (8 of them): its streams
    // report their usage, and the rate read from the first answers is in
    // its own tokens — not half of it, as the guessed count would make it.
    let url = engine_counting(Duration::ZERO, 12, 2.0, true).await;
    let gw = Gateway::start(&yaml(&url)).await;
    for i in 1..=3 {
        // 2,000 characters: 1,000 of the engine's tokens, 400 ms of prefill.
        answered(&gw.url("/v1/chat/completions"), &body(i, 500, true)).await;
    }
    let p = first_reading(&gw).await;
    let rate = p["tokens_per_s"].as_f64().unwrap();
    // Counted in the guess's tokens it would read 1,250 at best; a late
    // sleep on a shared host only lowers it.
    assert!(
        (RATE * 0.7..=RATE * 1.1).contains(&rate),
        "rate {rate} against {RATE}: {p}"
    );
}
