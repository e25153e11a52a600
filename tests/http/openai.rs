//! The OpenAI surface beyond chat: the Responses API (ids that carry their
//! instance, follow-ups and retrieves pinned to it, streams rewritten in
//! passing), embeddings, `GET /v1/models/{model}`, and vLLM's pass-through
//! routes, multipart uploads included, against real HTTP upstreams.

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::*;

async fn fleet(n: usize) -> Vec<Upstream> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Upstream::start(&format!("u{i}"), Mode::Json).await);
    }
    v
}

async fn json_of(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

fn responses_body(input: &str, prev: Option<&str>) -> Value {
    let mut b = json!({"model": MODEL, "instructions": "Be brief.", "input": input});
    if let Some(p) = prev {
        b["previous_response_id"] = json!(p);
    }
    b
}

/// `kvgate_requests_total` of the Responses API's 2xx on endpoint `byid`.
async fn by_id_counted(gw: &Gateway) -> f64 {
    let series = "kvgate_requests_total{endpoint=\"byid\",api=\"responses\",status=\"2xx\"}";
    gw.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_and_retrieves_reach_the_instance_that_stored_the_response() {
    let ups = fleet(4).await;
    let refs: Vec<&Upstream> = ups.iter().collect();
    // Its own endpoint name: no other test's requests count in its series.
    let gw = Gateway::start(
        &config(MODEL, &refs, "prefix_aware", 10).replace("name: chat", "name: byid"),
    )
    .await;
    let first = gw
        .post("/v1/responses", &responses_body("hello", None))
        .await;
    assert_eq!(first.status(), 200);
    let home = served_by(&first);
    let v = json_of(first).await;
    let mut id = v["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_kvg1_"), "{v}");
    assert_eq!(v["output"][0]["id"], "msg_1", "other ids are left alone");
    for u in &ups {
        let url = hex::encode(u.url().trim_start_matches("http://"));
        assert!(!id.contains(&url), "an instance address leaks in {id}");
    }
    // Prompts that hash anywhere: every follow-up still goes home.
    for turn in 0..12 {
        let resp = gw
            .post(
                "/v1/responses",
                &responses_body(&format!("turn {turn} {}", "x".repeat(turn * 97)), Some(&id)),
            )
            .await;
        assert_eq!(resp.status(), 200, "turn {turn}");
        assert_eq!(served_by(&resp), home, "turn {turn}");
        let v = json_of(resp).await;
        assert_eq!(
            v["previous_response_id"],
            json!(id),
            "echoed as kvgate's id"
        );
        id = v["id"].as_str().unwrap().to_owned();
    }
    let home_up = ups.iter().find(|u| u.state.name == home).unwrap();
    let last = home_up.seen().last().unwrap().body.clone();
    let sent: Value = serde_json::from_slice(&last).unwrap();
    assert!(
        sent["previous_response_id"]
            .as_str()
            .unwrap()
            .starts_with(&format!("resp_{home}_")),
        "the upstream got its own id: {sent}"
    );
    // Retrieve and cancel by kvgate's id.
    let before = by_id_counted(&gw).await;
    let got = client()
        .get(gw.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (got.status().as_u16(), served_by(&got)),
        (200, home.clone())
    );
    assert_eq!(json_of(got).await["id"], json!(id));
    let cancel = client()
        .post(gw.url(&format!("/v1/responses/{id}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(served_by(&cancel), home);
    assert_eq!(json_of(cancel).await["status"], "cancelled");
    // The by-id routes are counted, under the endpoint the id names.
    assert_eq!(
        by_id_counted(&gw).await - before,
        2.0,
        "a retrieve and a cancel"
    );
    // Ids kvgate did not issue are 404s in OpenAI's shape, sent nowhere.
    let hits: usize = ups.iter().map(Upstream::hits).sum();
    for bad in ["resp_abc", "resp_kvg1_00_00", &format!("{id}0")] {
        let r = client()
            .get(gw.url(&format!("/v1/responses/{bad}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{bad}");
        let e = json_of(r).await;
        assert_eq!(e["error"]["code"], "response_not_found", "{e}");
        let r = gw
            .post("/v1/responses", &responses_body("x", Some(bad)))
            .await;
        assert_eq!(r.status(), 404, "{bad}");
        assert_eq!(json_of(r).await["error"]["param"], "previous_response_id");
    }
    assert_eq!(ups.iter().map(Upstream::hits).sum::<usize>(), hits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_whose_instance_left_is_a_clear_404() {
    let ups = fleet(2).await;
    let refs: Vec<&Upstream> = ups.iter().collect();
    let gw = Gateway::start(&config(MODEL, &refs, "round_robin", 10)).await;
    let first = gw
        .post("/v1/responses", &responses_body("hello", None))
        .await;
    let home = served_by(&first);
    let id = json_of(first).await["id"].as_str().unwrap().to_owned();
    let stays: Vec<&Upstream> = ups.iter().filter(|u| u.state.name != home).collect();
    let cfg = kvgate::Config::from_yaml(&config(MODEL, &stays, "round_robin", 10)).unwrap();
    gw.state.reload(cfg).unwrap();
    let r = gw
        .post("/v1/responses", &responses_body("again", Some(&id)))
        .await;
    assert_eq!(r.status(), 404);
    let e = json_of(r).await;
    assert_eq!(e["error"]["code"], "response_not_found", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no longer"),
        "{e}"
    );
    let r = client()
        .get(gw.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_has_its_ids_rewritten_event_by_event() {
    let ups = fleet(1).await;
    let gw = Gateway::start(&config(MODEL, &[&ups[0]], "longest_prefix", 10)).await;
    let mut body = responses_body("stream me", None);
    body["stream"] = json!(true);
    let resp = gw.post("/v1/responses", &body).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = resp.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events.len(), 9, "{text}");
    let id = events[0]["response"]["id"].as_str().unwrap();
    assert!(id.starts_with("resp_kvg1_"), "{text}");
    assert_eq!(events[8]["response"]["id"], json!(id));
    assert!(!text.contains("\"resp_u0_"), "no upstream id leaks: {text}");
    let m = gw.metrics().await;
    assert!(
        m.lines().any(|l| l
            .starts_with("kvgate_time_to_first_token_seconds_count{endpoint=\"chat\",upstream=\"")
            && l.ends_with(" 1")),
        "{m}"
    );
    assert!(
        m.lines().any(
            |l| l.starts_with("kvgate_upstream_completion_tokens_total{") && l.ends_with(" 3")
        ),
        "output tokens from the Responses usage: {m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_spread_by_load_under_a_prefix_strategy_and_bad_input_stays_here() {
    let ups = fleet(3).await;
    for u in &ups {
        u.set_mode(Mode::Delay(std::time::Duration::from_secs(3)));
    }
    let refs: Vec<&Upstream> = ups.iter().collect();
    let gw = std::sync::Arc::new(Gateway::start(&config(MODEL, &refs, "prefix_aware", 10)).await);
    // The same input three times, each sent while the others are in flight:
    // prefix_aware would pin it to one instance; embeddings go where the
    // fewest requests are.
    let body = json!({"model": MODEL, "input": "the same text"});
    let mut calls = Vec::new();
    for n in 1..=3 {
        let gw2 = std::sync::Arc::clone(&gw);
        let body = body.clone();
        calls.push(tokio::spawn(async move {
            gw2.post("/v1/embeddings", &body).await
        }));
        let ups = &ups;
        eventually("the request in flight upstream", || {
            ups.iter().map(Upstream::hits).sum::<usize>() == n
        })
        .await;
    }
    let mut served = std::collections::HashSet::new();
    for c in calls {
        let r = c.await.unwrap();
        assert_eq!(r.status(), 200);
        served.insert(served_by(&r));
    }
    assert_eq!(served.len(), 3, "{served:?}");
    assert!(ups.iter().all(|u| u.seen()[0].path == "/v1/embeddings"));
    let hits: usize = ups.iter().map(Upstream::hits).sum();
    for (bad, param) in [
        (json!({"model": MODEL}), "input"),
        (json!({"model": MODEL, "input": 3}), "input"),
        (json!({"model": MODEL, "input": [1, "a"]}), "input[1]"),
        (json!({"input": "x"}), "model"),
    ] {
        let r = gw.post("/v1/embeddings", &bad).await;
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(json_of(r).await["error"]["param"], param, "{bad}");
    }
    let r = gw
        .post("/v1/embeddings", &json!({"model": "nope", "input": "x"}))
        .await;
    assert_eq!(r.status(), 404);
    assert_eq!(ups.iter().map(Upstream::hits).sum::<usize>(), hits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_routes_pass_through_by_model_with_the_clients_bytes() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "longest_prefix", 10)).await;
    let routes = [
        ("/tokenize", json!({"model": MODEL, "prompt": "hi"})),
        ("/detokenize", json!({"model": MODEL, "tokens": [1, 2]})),
        (
            "/v1/score",
            json!({"model": MODEL, "text_1": "a", "text_2": ["b", "c"]}),
        ),
        (
            "/v1/rerank",
            json!({"model": MODEL, "query": "q", "documents": ["d"]}),
        ),
        ("/pooling", json!({"model": MODEL, "input": "p"})),
    ];
    for (i, (path, body)) in routes.iter().enumerate() {
        let raw = serde_json::to_vec(body).unwrap();
        let r = client()
            .post(gw.url(&format!("{path}?x=1")))
            .header("content-type", "application/json")
            .body(raw.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let seen = &up.seen()[i];
        assert_eq!(seen.path, *path);
        assert_eq!(seen.body, raw, "{path}: forwarded as sent");
        let r = gw.post(path, &json!({"model": "nope"})).await;
        assert_eq!(r.status(), 404, "{path}");
        let r = gw.post(path, &json!({"prompt": "no model"})).await;
        assert_eq!(r.status(), 400, "{path}");
        let r = client()
            .post(gw.url(path))
            .header("content-type", "application/json")
            .body("{")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
    }
    assert_eq!(up.hits(), routes.len(), "nothing refused was forwarded");
}

fn multipart(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for (name, value) in fields {
        let file = if *name == "file" {
            "; filename=\"a.wav\"\r\nContent-Type: audio/wav"
        } else {
            ""
        };
        b.extend_from_slice(
            format!("--kvgB\r\nContent-Disposition: form-data; name=\"{name}\"{file}\r\n\r\n")
                .as_bytes(),
        );
        b.extend_from_slice(value);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(b"--kvgB--\r\n");
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transcription_uploads_route_by_their_form_model_and_arrive_whole() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let audio: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
    let send = |body: Vec<u8>| {
        client()
            .post(gw.url("/v1/audio/transcriptions"))
            .header("content-type", "multipart/form-data; boundary=kvgB")
            .body(body)
            .send()
    };
    for fields in [
        vec![("model", MODEL.as_bytes()), ("file", &audio[..])],
        vec![
            ("file", &audio[..]),
            ("language", b"en"),
            ("model", MODEL.as_bytes()),
        ],
    ] {
        let body = multipart(&fields);
        let r = send(body.clone()).await.unwrap();
        assert_eq!(r.status(), 200);
        let seen = up.seen().last().unwrap().clone();
        assert_eq!(seen.path, "/v1/audio/transcriptions");
        assert_eq!(seen.body, body, "the upload arrives byte for byte");
        assert!(
            seen.headers["content-type"]
                .to_str()
                .unwrap()
                .contains("boundary=kvgB")
        );
    }
    let hits = up.hits();
    let r = send(multipart(&[("model", b"nope"), ("file", b"x")]))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = send(multipart(&[("file", b"x")])).await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(json_of(r).await["error"]["param"], "model");
    let r = send(multipart(&[
        ("model", MODEL.as_bytes()),
        ("file", &vec![0u8; 70_000]),
    ]))
    .await
    .unwrap();
    assert_eq!(r.status(), 413, "over the body limit");
    let r = client()
        .post(gw.url("/v1/audio/transcriptions"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(up.hits(), hits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_is_retrieved_by_an_id_with_slashes() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config("org/model-a", &[&up], "prefix_aware", 10)).await;
    let r = client()
        .get(gw.url("/v1/models/org/model-a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v = json_of(r).await;
    assert_eq!(
        (v["id"].as_str(), v["object"].as_str()),
        (Some("org/model-a"), Some("model"))
    );
    let r = client()
        .get(gw.url("/v1/models/org/none"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(json_of(r).await["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_arrives_event_by_event_and_leaving_it_closes_the_upstream() {
    let created = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_up_1\"}}\n\n";
    let delta = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n";
    let up = Upstream::start(
        "u0",
        Mode::Stream {
            chunks: vec![created.into(), delta.into(), delta.into()],
            gap: std::time::Duration::from_secs(60),
        },
    )
    .await;
    let gw = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let mut body = responses_body("stream", None);
    body["stream"] = json!(true);
    let resp = gw.post("/v1/responses", &body).await;
    let mut stream = resp.bytes_stream();
    // The first event comes before the upstream's next, rewritten.
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
        .await
        .expect("the first event was held back")
        .unwrap()
        .unwrap();
    let first = String::from_utf8(first.to_vec()).unwrap();
    assert!(
        first.contains("resp_kvg1_") && !first.contains("resp_up_1"),
        "{first}"
    );
    drop(stream);
    eventually("upstream stream cancelled", || up.cancelled() == 1).await;
    gw.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_responses_input_is_a_400_and_never_forwarded() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&up], "longest_prefix", 10)).await;
    for (bad, param) in [
        (json!({"model": MODEL}), "input"),
        (json!({"model": MODEL, "input": 1}), "input"),
        (json!({"model": MODEL, "input": [3]}), "input[0]"),
        (
            json!({"model": MODEL, "input": "x", "instructions": []}),
            "instructions",
        ),
        (
            json!({"model": MODEL, "input": "x", "previous_response_id": 5}),
            "previous_response_id",
        ),
        (
            json!({"model": MODEL, "input": "x", "stream": "yes"}),
            "stream",
        ),
        (json!({"input": "x"}), "model"),
    ] {
        let r = gw.post("/v1/responses", &bad).await;
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(json_of(r).await["error"]["param"], param, "{bad}");
    }
    assert_eq!(up.hits(), 0);
}
