//! The OpenAPI document matches what is served: every route in the route
//! table is documented with its method, every documented path is served, every
//! `$ref` resolves, and every served route answers (no 404 route_not_found).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::Value;

fn document() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.yaml"))
            .unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// axum's `{*path}` is OpenAPI's `{path}`.
fn openapi_path(route: &str) -> String {
    route.replace("{*", "{")
}

fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    if let Some(s) = x.as_str() {
                        out.push(s);
                    }
                } else {
                    refs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

#[test]
fn document_is_valid_and_covers_exactly_the_served_routes() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["info"]["title"].is_string());
    let paths = doc["paths"].as_object().unwrap();
    let served: BTreeSet<(String, String)> = kvgate::api::routes()
        .into_iter()
        .map(|(m, p)| (m.to_owned(), openapi_path(p)))
        .collect();
    let documented: BTreeSet<(String, String)> = paths
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), p.clone()))
        })
        .filter(|(m, _)| matches!(m.as_str(), "get" | "post" | "put" | "delete" | "patch"))
        .collect();
    assert_eq!(
        served, documented,
        "served routes and the OpenAPI paths differ"
    );
    for (path, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path} has no responses"
            );
            // Every path parameter in the template is declared.
            for seg in path.split('/').filter(|s| s.starts_with('{')) {
                let name = seg.trim_matches(|c| c == '{' || c == '}');
                let params = op["parameters"].as_array().cloned().unwrap_or_default();
                let declared = params.iter().any(|p| {
                    let p = match p["$ref"].as_str() {
                        Some(r) => resolve(&doc, r).clone(),
                        None => p.clone(),
                    };
                    p["name"] == name && p["in"] == "path"
                });
                assert!(
                    declared,
                    "{method} {path}: path parameter {name} not declared"
                );
            }
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        assert!(!resolve(&doc, r).is_null(), "dangling $ref {r}");
    }
}

fn resolve<'a>(doc: &'a Value, r: &str) -> &'a Value {
    let ptr = r
        .strip_prefix('#')
        .unwrap_or_else(|| panic!("external $ref {r}"));
    doc.pointer(ptr).unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_in_the_table_is_served() {
    let up = Upstream::start("u", Mode::Json).await;
    let gw = Gateway::start(&config("m", &[&up], "prefix_aware", 10)).await;
    for (method, path) in kvgate::api::routes() {
        let path = path
            .replace("{endpoint}", "chat")
            .replace("{*path}", "v1/chat/completions");
        let req = match method {
            "get" => client().get(gw.url(&path)),
            "delete" => client().delete(gw.url(&path)),
            _ => client()
                .post(gw.url(&path))
                .body(r#"{"model":"m","messages":[],"inputs":"x"}"#),
        };
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        assert!(
            status != 405 && !body.contains("route_not_found"),
            "{method} {path}: {status} {body}"
        );
    }
}
