//! EndpointSlice discovery against the Kubernetes API's own JSON (recorded
//! in fixtures/kubernetes): an API server on loopback serves the list and a
//! watch the test feeds one event at a time. Pods join (ADDED, MODIFIED),
//! leave when not ready or terminating, the watch expires (410) and the
//! gateway re-lists, a slice is DELETED: traffic flows throughout and
//! nothing fails.

use std::collections::VecDeque;
use std::sync::Mutex;

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use tokio::sync::mpsc;

use super::discovery::{Traffic, fleet, ids};
use super::*;

fn fixture(name: &str, port: u16) -> String {
    let path = format!("{}/fixtures/kubernetes/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap()
        .replace("__PORT__", &port.to_string())
}

#[derive(Default)]
struct Api {
    lists: Mutex<VecDeque<String>>,
    watches: Mutex<VecDeque<mpsc::UnboundedReceiver<String>>>,
    /// Every request's query: (watch?, labelSelector).
    seen: Mutex<Vec<(bool, String)>>,
}

type Shared = Arc<Api>;

async fn slices(
    State(api): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> axum::response::Response {
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let selector = q.get("labelSelector").cloned().unwrap_or_default();
    api.seen.lock().unwrap().push((watch, selector));
    let json = [("content-type", "application/json")];
    if !watch {
        let mut lists = api.lists.lock().unwrap();
        let body = if lists.len() > 1 {
            lists.pop_front().unwrap()
        } else {
            lists.front().cloned().unwrap_or_default()
        };
        return (json, body).into_response();
    }
    let rx = api.watches.lock().unwrap().pop_front();
    let lines = futures_util::stream::unfold(rx, |rx| async move {
        match rx {
            Some(mut rx) => {
                let line = rx.recv().await?;
                Some((Ok::<_, std::io::Error>(format!("{line}\n")), Some(rx)))
            }
            // No more watches scripted: hold this one open, quietly.
            None => std::future::pending().await,
        }
    });
    (json, axum::body::Body::from_stream(lines)).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_join_and_leave_as_endpointslices_change() {
    let (port, ups) = fleet(&[2, 3, 4, 5]).await;
    let api: Shared = Arc::default();
    let (w1, r1) = mpsc::unbounded_channel();
    let (w2, r2) = mpsc::unbounded_channel();
    api.lists
        .lock()
        .unwrap()
        .extend([fixture("list-1.json", port), fixture("list-2.json", port)]);
    api.watches.lock().unwrap().extend([r1, r2]);
    let app = axum::Router::new()
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices",
            axum::routing::get(slices),
        )
        .with_state(Arc::clone(&api));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let yaml = format!(
        r#"server:
  listen: "127.0.0.1:0"
  failover_cooldown_ms: 60000
endpoints:
  - name: chat
    models: ["{MODEL}"]
    discovery:
      kubernetes: {{ namespace: serving, service: vllm, port: http, api_server: "{api_url}" }}
    routing:
      strategy: prefix_aware
      prefix_length: 1024
      concurrency_threshold: 64
"#
    );
    let gw = Arc::new(Gateway::start(&yaml).await);
    // The list: two ready pods; a third is not ready yet.
    eventually("the listed pods", || ids(&gw) == ["vllm-0", "vllm-1"]).await;
    assert!(
        api.seen.lock().unwrap()[0].1 == "kubernetes.io/service-name=vllm",
        "the watch selects the Service's slices: {:?}",
        api.seen.lock().unwrap()
    );

    let traffic = Traffic::start(&gw);
    traffic.flows("traffic flowing").await;

    // MODIFIED: vllm-1 is terminating (a rolling update), vllm-2 is ready.
    let lines = fixture("watch-1.jsonl", port);
    let mut lines = lines.lines();
    w1.send(lines.next().unwrap().to_owned()).unwrap();
    eventually("vllm-1 out, vllm-2 in", || ids(&gw) == ["vllm-0", "vllm-2"]).await;
    let terminating_hits = ups[1].hits();
    traffic.flows("traffic after the rollout").await;
    assert_eq!(
        ups[1].hits(),
        terminating_hits,
        "a terminating pod takes no new requests"
    );
    assert!(ups[2].hits() > 0, "the new pod takes traffic");

    // ADDED: a second slice.
    w1.send(lines.next().unwrap().to_owned()).unwrap();
    eventually("the second slice's pod", || {
        ids(&gw) == ["vllm-0", "vllm-2", "vllm-3"]
    })
    .await;

    // The watch expires (410 Gone): the gateway lists again, then watches.
    w1.send(lines.next().unwrap().to_owned()).unwrap();
    eventually("a second list", || {
        api.seen.lock().unwrap().iter().filter(|(w, _)| !w).count() >= 2
    })
    .await;
    eventually("a second watch", || {
        api.seen.lock().unwrap().iter().filter(|(w, _)| *w).count() >= 2
    })
    .await;
    assert_eq!(ids(&gw), ["vllm-0", "vllm-2", "vllm-3"]);

    // DELETED: the second slice goes.
    w2.send(fixture("watch-2.jsonl", port).trim().to_owned())
        .unwrap();
    eventually("the deleted slice's pod leaves", || {
        ids(&gw) == ["vllm-0", "vllm-2"]
    })
    .await;
    traffic.flows("traffic at the end").await;

    assert_eq!(
        traffic.failed().await,
        0,
        "requests failed while pods changed"
    );
    let url = gw
        .instances()
        .iter()
        .find(|i| i.id == "vllm-2")
        .map(|i| i.url.clone());
    assert_eq!(url, Some(format!("http://127.0.0.4:{port}")));
}
