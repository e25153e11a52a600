//! `deploy/grafana/`: the dashboard and the alert rules name only metrics a
//! real gateway serves, and the dashboard has the panels a platform team
//! looks for first.

use std::collections::BTreeSet;

use serde_json::Value;

use super::*;

/// Every `expr` string anywhere in a document.
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

/// The `kvgate_*` identifiers a PromQL expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("kvgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/deploy/grafana/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_name_is_served() {
    let ups = [
        Upstream::start("u0", Mode::Json).await,
        Upstream::start("u1", Mode::Json).await,
    ];
    let gw = Gateway::start(&config(MODEL, &[&ups[0], &ups[1]], "longest_prefix", 10)).await;
    assert_eq!(
        gw.chat(&chat_body(MODEL, "s", "q", false)).await.status(),
        200
    );
    let bad = client()
        .post(gw.url("/v1/chat/completions"))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let text = gw.metrics().await;
    let served: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let dashboard: Value = serde_json::from_str(&read("kvgate-dashboard.json")).unwrap();
    let alerts: Value = serde_saphyr::from_str(&read("alerts.yaml")).unwrap();
    for (what, doc) in [("dashboard", &dashboard), ("alerts", &alerts)] {
        let mut all = Vec::new();
        exprs(doc, &mut all);
        assert!(all.len() >= 8, "{what}: {} expressions", all.len());
        for e in &all {
            let names = metric_names(e);
            assert!(!names.is_empty(), "{what}: {e} names no kvgate metric");
            for name in names {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| served.contains(b)))
                    .unwrap_or(&name);
                assert!(served.contains(family), "{what}: {name} is not served\n{e}");
            }
        }
    }
    let titles: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["title"].as_str().unwrap().to_lowercase())
        .collect();
    for wanted in [
        "kv-cache hit rate",
        "time to first token",
        "routing reasons",
        "overflow",
        "health",
        "tenant rejections",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(wanted)),
            "no {wanted} panel: {titles:?}"
        );
    }
    let rules = alerts["groups"][0]["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .all(|r| r["alert"].is_string() && r["labels"]["severity"].is_string())
    );
}
