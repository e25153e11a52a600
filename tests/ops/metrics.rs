//! `/metrics` as an operator reads it: a reload that removes an instance
//! removes its series; refusals (401, 415, 429) and clients that leave before
//! the answer are counted in `kvgate_requests_total`.

use super::*;

/// The value of the sample line `series` (exactly as rendered), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_an_instance_removes_its_series() {
    let a = Upstream::start("a", Mode::Json).await;
    let b = Upstream::start("b", Mode::Json).await;
    let yaml = |ups: &[&Upstream]| {
        config(MODEL, ups, "round_robin", 10).replace("name: chat", "name: removedep")
    };
    let gw = Gateway::start(&yaml(&[&a, &b])).await;
    for p in 0..4 {
        let r = gw
            .chat(&chat_body(MODEL, &system_prompt(p), "q", false))
            .await;
        assert_eq!(r.status(), 200);
    }
    assert!(b.hits() > 0, "round robin never reached b");
    let gone = format!("upstream=\"{}\"", b.url());
    let kept = format!("upstream=\"{}\"", a.url());
    let text = gw.metrics().await;
    for family in [
        "kvgate_instance_healthy",
        "kvgate_instance_in_flight",
        "kvgate_routing_decisions_total",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(family) && l.contains(&gone)),
            "{family} of b before the reload:\n{text}"
        );
    }
    gw.state
        .reload(kvgate::Config::from_yaml(&with_admin(&yaml(&[&a]))).unwrap())
        .unwrap();
    let text = gw.metrics().await;
    let left: Vec<&str> = text.lines().filter(|l| l.contains(&gone)).collect();
    assert!(left.is_empty(), "b's series after the reload: {left:#?}");
    let healthy = format!("kvgate_instance_healthy{{endpoint=\"removedep\",{kept}}}");
    assert_eq!(sample(&text, &healthy), Some(1.0), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("kvgate_routing_decisions_total") && l.contains(&kept)),
        "a's counters stay:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_requests_whose_client_left_are_counted() {
    let up = Upstream::start("u", Mode::Json).await;
    let key = "sk-count";
    let sha = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(key.as_bytes()))
    };
    let yaml = format!(
        "{}auth:\n  mode: api_key\n  api_keys:\n    - {{ tenant: counted, sha256: \"{sha}\" }}\ntenants:\n  default: {{ requests_per_minute: 1 }}\nisolation:\n  upstream_cache_salt: false\n",
        config(MODEL, &[&up], "prefix_aware", 10).replace("name: chat", "name: countep")
    );
    let gw = Gateway::start(&yaml).await;
    let native = |token: Option<&str>, content_type: &str| {
        let r = client()
            .post(gw.url("/endpoints/countep/invocations"))
            .header("content-type", content_type)
            .body(r#"{"inputs":"hello"}"#);
        match token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(native(None, "application/json").send().await.unwrap()),
        401
    );
    // SageMaker's wire: a wrong content type is a ValidationError (400), still a 4xx.
    assert_eq!(
        status(native(Some(key), "text/plain").send().await.unwrap()),
        400
    );
    assert_eq!(
        status(native(Some(key), "application/json").send().await.unwrap()),
        200
    );
    assert_eq!(
        status(native(Some(key), "application/json").send().await.unwrap()),
        429
    );
    let chat_401 = "kvgate_requests_total{endpoint=\"\",api=\"chat\",status=\"4xx\"}";
    let before = sample(&gw.metrics().await, chat_401).unwrap_or(0.0);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .body(serde_json::to_vec(&chat_body(MODEL, "s", "q", false)).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let text = gw.metrics().await;
    let series = |status: &str| {
        format!("kvgate_requests_total{{endpoint=\"countep\",api=\"native\",status=\"{status}\"}}")
    };
    assert_eq!(sample(&text, &series("4xx")), Some(3.0), "{text}");
    assert_eq!(sample(&text, &series("2xx")), Some(1.0), "{text}");
    // Before the endpoint is known (the body is unread), a refusal counts with an empty one.
    assert!(
        sample(&text, chat_401).unwrap_or(0.0) >= before + 1.0,
        "{text}"
    );

    // A client that gives up before a non-streamed answer begins is counted too.
    let hold = Upstream::start("hold", Mode::Hold).await;
    let gw = Gateway::start(
        &config(MODEL, &[&hold], "prefix_aware", 10).replace("name: chat", "name: cancelep"),
    )
    .await;
    let gave_up = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body(MODEL, "s", "q", false)).unwrap())
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(gave_up.is_err(), "the held request was answered");
    eventually("the gateway let the upstream go", || hold.cancelled() == 1).await;
    let cancelled =
        "kvgate_requests_total{endpoint=\"cancelep\",api=\"chat\",status=\"cancelled\"}";
    let mut text = String::new();
    for _ in 0..100 {
        text = gw.metrics().await;
        if sample(&text, cancelled).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sample(&text, cancelled), Some(1.0), "{text}");
    let duration = "kvgate_request_duration_seconds_count{endpoint=\"cancelep\",api=\"chat\"}";
    assert_eq!(sample(&text, duration), Some(1.0), "{text}");
}
