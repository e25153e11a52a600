//! Gateway replicas that route as one (`cluster.sync_ms`): `kvgate serve`
//! processes sharing one real `redis-server`, a conversation's turns sent to
//! each in turn as an L4 balancer without affinity would. `longest_prefix`
//! finds each conversation's holder whichever replica a turn reaches, a
//! replica started late catches up from the routed stream, one replica's
//! requests in flight weigh in the other's decisions, and with Redis killed
//! the replicas keep serving on their own view and share again once it is
//! back. (Here beside `cluster.rs`, whose Redis and process harness it uses.)

use super::cluster::{Redis, Replica};
use super::*;

const INSTANCES: usize = 4;

fn routing_config(ups: &[&Upstream], redis: &Redis) -> String {
    let instances: String = ups
        .iter()
        .map(|u| format!("      - url: \"{}\"\n", u.url()))
        .collect();
    format!(
        r#"server:
  listen: "127.0.0.1:0"
endpoints:
  - name: chat
    models: ["{MODEL}"]
    instances:
{instances}    routing:
      strategy: longest_prefix
admin:
  token: "{ADMIN_TOKEN}"
cluster:
  redis: "{}"
  timeout_ms: 500
  heartbeat_ms: 200
  slot_lease_ms: 1500
  sync_ms: 20
"#,
        redis.url()
    )
}

/// Turn `turn` of conversation `c`: its own system prompt, then every
/// earlier question and answer, about 700 characters a turn.
fn turn(c: usize, turn: usize) -> Value {
    let mut messages =
        vec![json!({"role": "system", "content": format!("Conversation {c}. ").repeat(40)})];
    for t in 0..turn {
        messages
            .push(json!({"role": "user", "content": format!("Question {t} of {c}: ").repeat(20)}));
        if t + 1 < turn {
            messages.push(json!({"role": "assistant", "content": "hi"}));
        }
    }
    json!({"model": MODEL, "messages": messages})
}

async fn send(r: &Replica, body: &Value) -> reqwest::Response {
    client()
        .post(r.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .unwrap()
}

/// Until `r` has put at least `n` of the other replicas' placements in its index.
async fn applied(r: &Replica, n: usize) {
    for _ in 0..400 {
        let got = r
            .metric("kvgate_cluster_routed_total{direction=\"applied\"}")
            .await;
        if got.is_some_and(|v| v >= n as f64) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "replica never applied {n} placements\n{}",
        r.log.lock().unwrap().join("\n")
    );
}

/// `POST /admin/explain` on `r`: each instance's in-flight count and the chosen one.
async fn explain(r: &Replica, body: &Value) -> Value {
    let resp = client()
        .post(r.url("/admin/explain/v1/chat/completions"))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

/// Each conversation's first turn through `first`, its second through
/// `second`: the holders, and how many second turns found theirs.
async fn conversations(first: &Replica, second: &Replica, range: std::ops::Range<usize>) -> usize {
    let mut holders = Vec::new();
    for c in range.clone() {
        let resp = send(first, &turn(c, 1)).await;
        assert_eq!(resp.status(), 200);
        holders.push(served_by(&resp));
    }
    applied(second, range.end).await;
    let mut kept = 0;
    for (c, holder) in range.zip(holders) {
        let resp = send(second, &turn(c, 2)).await;
        assert_eq!(resp.status(), 200);
        kept += usize::from(served_by(&resp) == holder);
    }
    kept
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_route_a_conversation_to_its_holder_through_redis_and_survive_its_loss() {
    let mut ups = Vec::new();
    for i in 0..INSTANCES {
        ups.push(Upstream::start(&format!("u{i}"), Mode::Json).await);
    }
    let refs: Vec<&Upstream> = ups.iter().collect();
    let redis = Redis::start().await;
    let yaml = routing_config(&refs, &redis);
    let (a, b) = (Replica::start(&yaml).await, Replica::start(&yaml).await);
    a.sees(2).await;
    b.sees(2).await;

    // Each second turn reaches the other replica, and its holder all the same.
    let kept = conversations(&a, &b, 0..8).await;
    assert_eq!(kept, 8, "second turns that found their holder");

    // A replica started now catches up from the routed stream.
    let c = Replica::start(&yaml).await;
    c.sees(3).await;
    applied(&c, 16).await;
    let caught = c.metric("kvgate_cluster_catch_up_seconds").await;
    assert!(caught.is_some_and(|s| s < 5.0), "{caught:?}");
    for conv in 0..8 {
        let why = explain(&c, &turn(conv, 3)).await;
        assert_eq!(why["reason"], "cache_hit", "conversation {conv}: {why}");
    }

    // One replica's requests in flight weigh in the other's decisions.
    for u in &ups {
        u.set_mode(Mode::Hold);
    }
    let held: Vec<_> = (0..3)
        .map(|i| {
            let req = client()
                .post(a.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&turn(100, i + 1)).unwrap())
                .send();
            tokio::spawn(req)
        })
        .collect();
    let busy = || {
        let b = &b;
        async move {
            let why = explain(b, &turn(200, 1)).await;
            why["instances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["in_flight"].as_u64().unwrap())
                .sum::<u64>()
        }
    };
    let mut seen = 0;
    for _ in 0..200 {
        seen = busy().await;
        if seen == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(seen, 3, "the other replica's requests in flight");
    for h in held {
        h.abort();
    }
    for u in &ups {
        u.set_mode(Mode::Json);
    }

    // Redis killed: every replica keeps serving on its own view.
    let port = redis.kill().await;
    for (i, r) in [&a, &b, &c].into_iter().enumerate() {
        let resp = send(r, &turn(300 + i, 1)).await;
        assert_eq!(resp.status(), 200, "served without Redis");
    }
    for r in [&a, &b] {
        let mut failed = None;
        for _ in 0..200 {
            failed = r
                .metric("kvgate_cluster_sync_total{outcome=\"failed\"}")
                .await;
            if failed.is_some_and(|n| n >= 1.0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(failed.is_some_and(|n| n >= 1.0), "{failed:?}");
        assert_eq!(r.logged("Redis unreachable"), 1, "logged once per outage");
    }

    // Back: the replicas converge and share placements again.
    let _redis = Redis::start_on(port).await;
    a.sees(3).await;
    b.sees(3).await;
    let before = b
        .metric("kvgate_cluster_routed_total{direction=\"applied\"}")
        .await
        .unwrap_or(0.0) as usize;
    let mut holders = Vec::new();
    for conv in 400..406 {
        let resp = send(&a, &turn(conv, 1)).await;
        holders.push(served_by(&resp));
    }
    applied(&b, before + 6).await;
    for (conv, holder) in (400..406).zip(holders) {
        let resp = send(&b, &turn(conv, 2)).await;
        assert_eq!(
            served_by(&resp),
            holder,
            "conversation {conv} after Redis came back"
        );
    }
}
