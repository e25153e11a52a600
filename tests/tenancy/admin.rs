//! The admin routes as a client sees them: off (403) until `admin.token` is
//! set; then only that token opens them (a tenant's valid credential is a
//! 401); `explain` speaks for the tenant named in `?tenant=` and meets its
//! model allow-list as the real request would.

use serde_json::{Value, json};

use super::*;

const OTHER_MODEL: &str = "other-model";

/// JWT tenants over one endpoint serving two models; `acme` may use one.
fn two_model_config(up: &Upstream, admin: &str) -> String {
    let base = jwt_config(
        &[up],
        "tenants:\n  overrides:\n    acme: { max_concurrency: 3, models: [\"test-model\"] }\n",
    );
    format!(
        "{}{admin}",
        base.replace(
            "models: [\"test-model\"]\n    instances",
            &format!("models: [\"test-model\", \"{OTHER_MODEL}\"]\n    instances")
        )
    )
}

async fn admin_post(
    gw: &Gateway,
    query: &str,
    token: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    post(
        gw,
        &format!("/admin/explain/v1/chat/completions{query}"),
        token,
        serde_json::to_vec(body).unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_are_off_without_an_admin_token() {
    let up = Upstream::start("u0", Mode::Json).await;
    // `admin:` without a token: the harness adds none.
    let gw = Gateway::start(&two_model_config(&up, "admin: {}\n")).await;
    let body = small_chat("q");
    let tenant = hs256(&claims("acme"));
    for token in [None, Some(tenant.as_str()), Some(ADMIN_TOKEN)] {
        let resp = admin_post(&gw, "", token, &body).await;
        assert_eq!(resp.status(), 403, "{token:?}");
        let v = error_body(resp, "admin off").await;
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("admin.token"),
            "{v}"
        );
    }
    // The tenant's own routes are unaffected.
    assert_eq!(chat(&gw, &tenant, &body).await.status(), 200);
    assert_eq!(up.hits(), 1, "explain must not forward");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_admin_token_opens_admin_routes() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&two_model_config(&up, "")).await;
    let body = small_chat("q");
    let tenant = hs256(&claims("acme"));
    let wrong = format!("{ADMIN_TOKEN}x");
    for (what, token) in [
        ("no credential", None),
        ("a tenant's valid JWT", Some(tenant.as_str())),
        ("a wrong token", Some(wrong.as_str())),
    ] {
        let resp = admin_post(&gw, "", token, &body).await;
        assert_eq!(resp.status(), 401, "{what}");
        assert!(resp.headers().contains_key("www-authenticate"), "{what}");
        error_body(resp, what).await;
    }
    let resp = admin_post(&gw, "?tenant=acme", Some(ADMIN_TOKEN), &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["tenant_limits"]["max_concurrency"], 3);
    assert_eq!(v["tenant_limits"]["models"], json!(["test-model"]));
    assert_eq!(up.hits(), 0, "explain must not forward");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_meets_the_tenants_model_allow_list() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&two_model_config(&up, "")).await;
    let other = chat_body(OTHER_MODEL, "sys", "q", false);
    // The real request: acme may not use the other model.
    let acme = hs256(&claims("acme"));
    assert_eq!(chat(&gw, &acme, &other).await.status(), 403);
    // Explained for acme: the same 403, in the same shape.
    let resp = admin_post(&gw, "?tenant=acme", Some(ADMIN_TOKEN), &other).await;
    assert_eq!(resp.status(), 403);
    let v = error_body(resp, "explain, model not allowed").await;
    assert_eq!(v["error"]["param"], "model");
    // Native route: acme may not use every model of the endpoint either.
    let native = post(
        &gw,
        "/admin/explain/endpoints/chat/invocations?tenant=acme",
        Some(ADMIN_TOKEN),
        serde_json::to_vec(&json!({"inputs": "hello"})).unwrap(),
    )
    .await;
    assert_eq!(native.status(), 403);
    // A tenant without an allow-list is explained as usual.
    let resp = admin_post(&gw, "?tenant=beta", Some(ADMIN_TOKEN), &other).await;
    assert_eq!(resp.status(), 200);
    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(
        (v["tenant"].as_str(), v["model"].as_str()),
        (Some("beta"), Some(OTHER_MODEL))
    );
    // A tenant id that could be no tenant's is a 400.
    let bad = admin_post(&gw, "?tenant=a%20b", Some(ADMIN_TOKEN), &other).await;
    assert_eq!(bad.status(), 400);
    assert_eq!(up.hits(), 0, "explain must not forward");
}
