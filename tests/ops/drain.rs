//! Draining an instance without a reload: the admin call stops new requests
//! to it (not even as a last resort) while its in-flight ones finish, it
//! survives a reload, and undraining puts it back.

use super::*;

async fn admin(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    let mut req = client()
        .request(method, gw.url(path))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&b).unwrap());
    }
    req.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_instance_finishes_what_it_has_and_takes_nothing_new() {
    let a = Upstream::start("a", Mode::Delay(Duration::from_millis(1500))).await;
    let b = Upstream::start("b", Mode::Json).await;
    let yaml = config(MODEL, &[&a, &b], "round_robin", 64);
    let gw = Arc::new(Gateway::start(&yaml).await);
    let a_id = a.url();

    // Requests in flight on `a` when it is drained.
    let mut held = Vec::new();
    for n in 0..6 {
        let gw = gw.clone();
        held.push(tokio::spawn(async move {
            gw.chat(&chat_body(MODEL, &system_prompt(n), "q", false))
                .await
                .status()
        }));
    }
    eventually("requests in flight on a", || {
        a.state.active.load(Ordering::SeqCst) > 0
    })
    .await;
    let resp = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/instances/drain",
        Some(serde_json::json!({"endpoint": "chat", "instance": a_id})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let state = resp.json_value().await;
    assert_eq!(state["draining"], true, "{state}");
    assert!(state["in_flight"].as_u64().unwrap() > 0, "{state}");

    // New requests all go to b; a's in-flight ones finish with 200.
    let hits_a = a.hits();
    for n in 10..30 {
        let resp = gw
            .chat(&chat_body(MODEL, &system_prompt(n), "q", false))
            .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(served_by(&resp), "b");
    }
    assert_eq!(a.hits(), hits_a, "a drained instance takes no new request");
    for h in held {
        assert_eq!(
            h.await.unwrap(),
            200,
            "an in-flight request on the drained instance finished"
        );
    }
    let list = admin(&gw, reqwest::Method::GET, "/admin/instances", None)
        .await
        .json_value()
        .await;
    let a_state = list["endpoints"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == a_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(a_state["in_flight"], 0, "{list}");
    assert_eq!(a_state["draining"], true);

    // A reload keeps it drained; with b gone too, nothing goes to a: 503.
    gw.state
        .reload(kvgate::Config::from_yaml(&with_admin(&yaml)).unwrap())
        .unwrap();
    assert!(gw.instances()[0].is_draining(), "drain survives a reload");
    b.set_mode(Mode::Status(500));
    let resp = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/instances/drain",
        Some(serde_json::json!({"endpoint": "chat", "instance": b.url()})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert_eq!(resp.status(), 503, "every instance draining");
    assert_eq!(a.hits(), hits_a);

    // Undrain: traffic returns.
    a.set_mode(Mode::Json);
    let resp = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/instances/drain",
        Some(serde_json::json!({"endpoint": "chat", "instance": a_id, "draining": false})),
    )
    .await;
    assert_eq!(resp.json_value().await["draining"], false);
    let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(served_by(&resp), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_needs_the_admin_token_and_names_what_is_wrong() {
    let a = Upstream::start("a", Mode::Json).await;
    let gw = Gateway::start(&config(MODEL, &[&a], "round_robin", 64)).await;
    let body = serde_json::json!({"endpoint": "chat", "instance": a.url()});
    let anonymous = client()
        .post(gw.url("/admin/instances/drain"))
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(!gw.instances()[0].is_draining());
    for (body, status, param) in [
        (
            serde_json::json!({"endpoint": "nope", "instance": "x"}),
            404,
            "endpoint",
        ),
        (
            serde_json::json!({"endpoint": "chat", "instance": "nope"}),
            400,
            "instance",
        ),
    ] {
        let resp = admin(
            &gw,
            reqwest::Method::POST,
            "/admin/instances/drain",
            Some(body),
        )
        .await;
        assert_eq!(resp.status(), status);
        assert_eq!(resp.json_value().await["error"]["param"], param);
    }
    let resp = client()
        .post(gw.url("/admin/instances/drain"))
        .bearer_auth(ADMIN_TOKEN)
        .body("{\"endpoint\": 1}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(resp.json_value().await["error"]["message"].is_string());
}
