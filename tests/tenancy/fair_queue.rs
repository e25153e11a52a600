//! Fair queueing (`queue`): with the fleet saturated, requests wait in the
//! gateway and are released by priority, then least service, then arrival;
//! waits are bounded and refused in each API's shape; a client that leaves
//! is taken out; shutdown refuses what waits; a reload keeps the queue; a
//! tenant cannot raise its own priority.

use std::time::Duration;

use super::*;

/// One upstream answering after `delay`; one slot (`max_in_flight: 1`).
async fn saturated(delay: Duration, queue: &str) -> (Upstream, Gateway, String) {
    let up = Upstream::start("u0", Mode::Delay(delay)).await;
    let yaml = format!(
        "{}auth:\n  mode: api_key\n  api_keys:\n{}isolation:\n  upstream_cache_salt: false\ntenants:\n  default: {{ priority: normal }}\n  overrides:\n    vip: {{ priority: high, priority_header: true }}\n    lowly: {{ priority: low }}\n    picky: {{ priority: normal, priority_header: true }}\n    held: {{ max_concurrency: 1 }}\nqueue:\n  max_in_flight: 1\n{queue}",
        config(MODEL, &[&up], "prefix_aware", 10).replace("name: chat", "name: queued"),
        ["a", "b", "vip", "lowly", "picky", "held"]
            .iter()
            .map(|t| format!(
                "    - {{ tenant: {t}, sha256: \"{}\" }}\n",
                sha256_hex(&format!("sk-{t}"))
            ))
            .collect::<String>(),
    );
    let gw = Gateway::start(&yaml).await;
    (up, gw, yaml)
}

fn ask(tag: &str) -> Value {
    chat_body(MODEL, "You are a queue test.", tag, false)
}

/// Start a request in the background; its status when it ends.
fn spawn(
    gw: &Gateway,
    path: &'static str,
    key: &str,
    body: Value,
) -> tokio::task::JoinHandle<(u16, String)> {
    let url = gw.url(path);
    let key = format!("sk-{key}");
    tokio::spawn(async move {
        let r = client()
            .post(url)
            .header("content-type", "application/json")
            .bearer_auth(key)
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    })
}

fn waiting(gw: &Gateway) -> usize {
    gw.state
        .runtime
        .load()
        .endpoint("queued")
        .unwrap()
        .queue
        .len()
}

/// The user turn of each request the upstream saw, in arrival order.
fn arrivals(up: &Upstream) -> Vec<String> {
    up.seen()
        .iter()
        .map(|s| {
            let v: Value = serde_json::from_slice(&s.body).unwrap();
            v["messages"][1]["content"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_go_by_priority_then_least_service_then_arrival() {
    // Long enough that all five queue behind a0 on a busy machine.
    let (up, gw, _) = saturated(Duration::from_millis(1000), "").await;
    let mut jobs = vec![spawn(&gw, "/v1/chat/completions", "a", ask("a0"))];
    eventually("a0 holds the slot", || up.seen().len() == 1).await;
    for (n, (key, tag)) in [
        ("a", "a1"),
        ("a", "a2"),
        ("lowly", "low1"),
        ("b", "b1"),
        ("vip", "vip1"),
    ]
    .into_iter()
    .enumerate()
    {
        jobs.push(spawn(&gw, "/v1/chat/completions", key, ask(tag)));
        eventually("the request waits", || waiting(&gw) == n + 1).await;
    }
    for j in jobs {
        assert_eq!(j.await.unwrap().0, 200);
    }
    // FCFS would be a1 a2 low1 b1 vip1. vip goes first (high); b rejoined
    // level with a, and a's first answer then counted as service too, so b
    // goes before a's second; low goes last.
    assert_eq!(arrivals(&up), ["a0", "vip1", "b1", "a1", "a2", "low1"]);
    let m = gw.metrics().await;
    assert!(
        m.contains(
            "kvgate_queue_released_total{endpoint=\"queued\",tenant=\"vip\",priority=\"high\"} 1"
        ),
        "{m}"
    );
    assert!(m.lines().any(|l| l.starts_with("kvgate_tenant_service_total{endpoint=\"queued\",tenant=\"a\"}")), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_max_wait_is_refused_in_each_apis_shape_with_retry_after() {
    let (up, gw, _) = saturated(Duration::from_secs(3), "  max_wait_ms: 200\n").await;
    let holder = spawn(&gw, "/v1/chat/completions", "a", ask("hold"));
    eventually("the slot is taken", || up.seen().len() == 1).await;
    let openai = post(
        &gw,
        "/v1/chat/completions",
        Some("sk-b"),
        serde_json::to_vec(&ask("late")).unwrap(),
    )
    .await;
    assert_eq!(openai.status(), 429);
    assert_eq!(openai.headers()["retry-after"], "1");
    let v: Value = serde_json::from_slice(&openai.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "queue_timeout", "{v}");
    let messages =
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "late"}]});
    let anthropic = post(
        &gw,
        "/v1/messages",
        Some("sk-b"),
        serde_json::to_vec(&messages).unwrap(),
    )
    .await;
    assert_eq!(anthropic.status(), 429);
    let v: Value = serde_json::from_slice(&anthropic.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    let sagemaker = post(
        &gw,
        "/endpoints/queued/invocations",
        Some("sk-b"),
        serde_json::to_vec(&ask("late")).unwrap(),
    )
    .await;
    assert_eq!(sagemaker.status(), 503);
    assert_eq!(
        sagemaker.headers()["x-amzn-errortype"],
        "ThrottlingException"
    );
    assert!(sagemaker.headers().contains_key("retry-after"));
    assert_eq!(up.seen().len(), 1, "a refused request was forwarded");
    assert_eq!(holder.await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_the_queue_holds_nothing() {
    let (up, gw, _) = saturated(Duration::from_millis(600), "").await;
    let holder = spawn(&gw, "/v1/chat/completions", "a", ask("hold"));
    eventually("the slot is taken", || up.seen().len() == 1).await;
    // `held` may run one request at a time: the queued one holds its slot.
    let leaver = spawn(&gw, "/v1/chat/completions", "held", ask("leaves"));
    eventually("it waits", || waiting(&gw) == 1).await;
    leaver.abort();
    eventually("it left the queue at once", || waiting(&gw) == 0).await;
    assert_eq!(holder.await.unwrap().0, 200);
    // Its concurrency slot went with it, and it never reached the upstream.
    let again = post(
        &gw,
        "/v1/chat/completions",
        Some("sk-held"),
        serde_json::to_vec(&ask("again")).unwrap(),
    )
    .await;
    assert_eq!(again.status(), 200);
    assert_eq!(arrivals(&up), ["hold", "again"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_the_queue_and_a_reload_keeps_it() {
    let (up, mut gw, yaml) = saturated(Duration::from_millis(800), "").await;
    let holder = spawn(&gw, "/v1/chat/completions", "a", ask("hold"));
    eventually("the slot is taken", || up.seen().len() == 1).await;
    let kept = spawn(&gw, "/v1/chat/completions", "b", ask("kept"));
    eventually("it waits", || waiting(&gw) == 1).await;
    // A reload (a longer wait) keeps the waiting request; it is served.
    gw.state
        .reload(
            kvgate::Config::from_yaml(&with_admin(&yaml.replace(
                "max_in_flight: 1\n",
                "max_in_flight: 1\n  max_wait_ms: 60000\n",
            )))
            .unwrap(),
        )
        .unwrap();
    assert_eq!(waiting(&gw), 1);
    assert_eq!(kept.await.unwrap().0, 200);
    assert_eq!(holder.await.unwrap().0, 200);
    // Shutdown: what waits is refused with a 503 at once.
    let holder = spawn(&gw, "/v1/chat/completions", "a", ask("hold2"));
    eventually("the slot is taken", || up.seen().len() == 3).await;
    let refused = spawn(&gw, "/v1/chat/completions", "b", ask("refused"));
    eventually("it waits", || waiting(&gw) == 1).await;
    gw.shutdown();
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), refused)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        holder.await.unwrap().0,
        200,
        "the forwarded request finishes in the grace period"
    );
    assert!(!arrivals(&up).contains(&"refused".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_raise_its_own_priority() {
    let (up, gw, _) = saturated(Duration::from_millis(10), "").await;
    let send = |key: &'static str, priority: &'static str| {
        let gw = &gw;
        async move {
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("x-kvgate-priority", priority)
                .bearer_auth(format!("sk-{key}"))
                .body(serde_json::to_vec(&ask("p")).unwrap())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null);
            (status, v)
        }
    };
    let (s, v) = send("picky", "high").await;
    assert_eq!(s, 403, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("above"),
        "{v}"
    );
    assert_eq!(
        send("a", "high").await.0,
        403,
        "a tenant not allowed the header"
    );
    assert_eq!(send("picky", "urgent").await.0, 400);
    assert_eq!(send("picky", "low").await.0, 200, "lowering is allowed");
    assert_eq!(send("vip", "normal").await.0, 200);
    assert_eq!(up.seen().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_header_is_judged_the_same_with_the_queue_off() {
    let (up, gw, _) = saturated(Duration::from_millis(10), "  enabled: false\n").await;
    let send = |key: &'static str, priority: &'static str| {
        let gw = &gw;
        async move {
            client()
                .post(gw.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("x-kvgate-priority", priority)
                .bearer_auth(format!("sk-{key}"))
                .body(serde_json::to_vec(&ask("p")).unwrap())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(
        send("a", "high").await,
        403,
        "a tenant not allowed the header"
    );
    assert_eq!(send("picky", "high").await, 403, "above its own");
    assert_eq!(send("picky", "urgent").await, 400);
    assert_eq!(up.seen().len(), 0, "nothing refused was forwarded");
    assert_eq!(send("picky", "low").await, 200);
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_reporting_waiting_requests_is_saturated_and_the_rest_wait_in_the_gateway() {
    // An engine that runs one sequence at a time, 40 output tokens at 25 ms.
    let cfg = kvgate_sim::SimConfig {
        model: MODEL.into(),
        max_running: 1,
        time_scale: 1.0,
        ..kvgate_sim::SimConfig::llama70b_h100_tp4()
    };
    let sim = kvgate_sim::spawn_fleet(&cfg, 1).await.unwrap().remove(0);
    let yaml = format!(
        "server:\n  listen: \"127.0.0.1:0\"\nendpoints:\n  - name: queued\n    models: [\"{MODEL}\"]\n    instances:\n      - url: \"{}\"\n    routing:\n      strategy: prefix_aware\nqueue:\n  max_in_flight: 100\n  max_waiting: 0\n  engine_poll_ms: 20\n",
        sim.url()
    );
    let gw = Gateway::start(&yaml).await;
    let mut body = ask("x");
    body["max_tokens"] = json!(40);
    let jobs: Vec<_> = (0..6)
        .map(|i| {
            let mut b = body.clone();
            b["messages"][1]["content"] = json!(format!("request {i}"));
            let url = gw.url("/v1/chat/completions");
            tokio::spawn(async move {
                // Arrivals 250 ms apart: polls (every 20 ms) see the engine
                // between them, even on a busy machine.
                tokio::time::sleep(Duration::from_millis(250 * i)).await;
                client()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&b).unwrap())
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    // While they run, the engine never holds more than a couple waiting
    // (a poll's lag); the rest wait in the gateway.
    let (mut engine_max, mut gateway_max) = (0u64, 0usize);
    let metrics = format!("{}/metrics", sim.url());
    for _ in 0..80 {
        let text = client()
            .get(&metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if let Some(r) = kvgate::fleet::engine_load::parse(&text) {
            engine_max = engine_max.max(r.waiting);
        }
        gateway_max = gateway_max.max(waiting(&gw));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for j in jobs {
        assert_eq!(j.await.unwrap(), 200);
    }
    assert!(
        gateway_max >= 2,
        "nothing waited in the gateway (max {gateway_max})"
    );
    assert!(
        engine_max <= 3,
        "the engine's own queue reached {engine_max}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_queueing_off_lets_the_waiting_go_and_a_dead_fleet_is_not_waited_for() {
    let (up, gw, yaml) = saturated(Duration::from_millis(500), "").await;
    let holder = spawn(&gw, "/v1/chat/completions", "a", ask("hold"));
    eventually("the slot is taken", || up.seen().len() == 1).await;
    let waiter = spawn(&gw, "/v1/chat/completions", "b", ask("waits"));
    eventually("it waits", || waiting(&gw) == 1).await;
    let off = yaml.replace("queue:\n", "queue:\n  enabled: false\n");
    gw.state
        .reload(kvgate::Config::from_yaml(&with_admin(&off)).unwrap())
        .unwrap();
    // Released at once, not after max_wait_ms.
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiting request stayed queued after queueing was turned off")
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(holder.await.unwrap().0, 200);
    // With every instance cooling down, a request is not queued: it is tried
    // at once (the last-resort attempt on an instance taken out, or a 503).
    gw.state
        .reload(kvgate::Config::from_yaml(&with_admin(&yaml)).unwrap())
        .unwrap();
    let rt = gw.state.runtime.load_full();
    for i in &rt.endpoint("queued").unwrap().instances {
        i.cool_down(Duration::from_secs(60));
    }
    let started = std::time::Instant::now();
    let r = post(
        &gw,
        "/v1/chat/completions",
        Some("sk-a"),
        serde_json::to_vec(&ask("down")).unwrap(),
    )
    .await;
    assert!(r.status() == 200 || r.status() == 503, "{}", r.status());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(waiting(&gw), 0);
}
