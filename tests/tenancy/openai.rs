//! The routes beyond chat under tenancy: a response id is the tenant's own
//! (another tenant's is a 404, nothing forwarded), every new route is
//! authenticated, salted and held to the model allow-list, and an upload is
//! not charged as text.

use super::*;

fn responses(input: &str, prev: Option<&str>) -> Vec<u8> {
    let mut b = json!({"model": MODEL, "input": input});
    if let Some(p) = prev {
        b["previous_response_id"] = json!(p);
    }
    serde_json::to_vec(&b).unwrap()
}

async fn get(gw: &Gateway, path: &str, token: &str) -> reqwest::Response {
    client()
        .get(gw.url(path))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_use_anothers_response_id() {
    let ups = [
        Upstream::start("u0", Mode::Json).await,
        Upstream::start("u1", Mode::Json).await,
    ];
    let gw = Gateway::start(&jwt_config(&[&ups[0], &ups[1]], "")).await;
    let (a, b) = (hs256(&claims("tenant-a")), hs256(&claims("tenant-b")));
    let r = post(&gw, "/v1/responses", Some(&a), responses("hi", None)).await;
    assert_eq!(r.status(), 200);
    let id = serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hits = ups[0].hits() + ups[1].hits();
    let r = post(
        &gw,
        "/v1/responses",
        Some(&b),
        responses("mine now", Some(&id)),
    )
    .await;
    assert_eq!(r.status(), 404);
    let e = error_body(r, "b's follow-up").await;
    assert_eq!(e["error"]["code"], "response_not_found");
    for path in [format!("/v1/responses/{id}")] {
        assert_eq!(get(&gw, &path, &b).await.status(), 404, "{path}");
    }
    let r = client()
        .delete(gw.url(&format!("/v1/responses/{id}")))
        .header("authorization", format!("Bearer {b}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        ups[0].hits() + ups[1].hits(),
        hits,
        "nothing of b's was forwarded"
    );
    // The owner still can.
    let r = post(
        &gw,
        "/v1/responses",
        Some(&a),
        responses("again", Some(&id)),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        get(&gw, &format!("/v1/responses/{id}"), &a).await.status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_routes_are_authenticated_salted_and_held_to_the_allow_list() {
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml = jwt_config(
        &[&up],
        "tenants:\n  overrides:\n    limited: { models: [\"other/model-2\"] }\n",
    )
    .replace(
        &format!("models: [\"{MODEL}\"]"),
        &format!("models: [\"{MODEL}\", \"other/model-2\"]"),
    );
    let gw = Gateway::start(&yaml).await;
    let a = hs256(&claims("tenant-a"));
    let bodies = [
        ("/v1/responses", json!({"model": MODEL, "input": "x"})),
        ("/v1/embeddings", json!({"model": MODEL, "input": "x"})),
        ("/tokenize", json!({"model": MODEL, "prompt": "x"})),
        (
            "/v1/rerank",
            json!({"model": MODEL, "query": "q", "documents": ["d"]}),
        ),
    ];
    for (path, body) in &bodies {
        let raw = serde_json::to_vec(body).unwrap();
        assert_eq!(
            post(&gw, path, None, raw.clone()).await.status(),
            401,
            "{path}"
        );
        let r = post(&gw, path, Some(&hs256(&claims("limited"))), raw.clone()).await;
        assert_eq!(r.status(), 403, "{path}");
    }
    assert_eq!(up.hits(), 0);
    // The same salt reaches the upstream on every route as on chat.
    assert_eq!(chat(&gw, &a, &small_chat("q")).await.status(), 200);
    for (path, body) in &bodies {
        let r = post(&gw, path, Some(&a), serde_json::to_vec(body).unwrap()).await;
        assert_eq!(r.status(), 200, "{path}");
    }
    let seen = up.seen();
    let salt = |i: usize| {
        serde_json::from_slice::<Value>(&seen[i].body).unwrap()["cache_salt"]
            .as_str()
            .map(str::to_owned)
    };
    let chat_salt = salt(0).expect("chat is salted");
    for (i, (path, _)) in bodies.iter().enumerate() {
        assert_eq!(salt(i + 1).as_deref(), Some(chat_salt.as_str()), "{path}");
    }
    for path in ["/v1/models/x", "/v1/responses/resp_x"] {
        let r = client().get(gw.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_is_not_charged_as_text() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&jwt_config(
        &[&up],
        "tenants:\n  default: { tokens_per_minute: 1000 }\n",
    ))
    .await;
    let a = hs256(&claims("tenant-a"));
    // 60 KB of audio: 15,000 "tokens" at bytes / 4, fifteen times the quota.
    let mut form = format!("--b0\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{MODEL}\r\n--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n").into_bytes();
    form.extend(std::iter::repeat_n(7u8, 60_000));
    form.extend_from_slice(b"\r\n--b0--\r\n");
    for _ in 0..3 {
        let r = client()
            .post(gw.url("/v1/audio/transcriptions"))
            .header("authorization", format!("Bearer {a}"))
            .header("content-type", "multipart/form-data; boundary=b0")
            .body(form.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit-tokens"], "1000");
    }
    assert_eq!(up.hits(), 3);
}
