//! Real clients: the OpenAI Python SDK on the Responses API, embeddings and
//! models.retrieve, and `/metrics` read by Prometheus' own parser
//! (`prometheus_client`), both from tests/sdk/requirements.txt.

use super::*;

pub(super) async fn python(script: &str, args: &[&str], stdin: Option<String>) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("python3")
        .arg(script)
        .args(args)
        .env("NO_PROXY", "*")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 must be installed (pip install -r tests/sdk/requirements.txt)");
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .await
        .unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.starts_with("ok"),
        "{script} failed (pip install -r tests/sdk/requirements.txt)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_speaks_responses_embeddings_and_models_retrieve() {
    let ups = [
        Upstream::start("u0", Mode::Json).await,
        Upstream::start("u1", Mode::Json).await,
        Upstream::start("u2", Mode::Json).await,
    ];
    let refs: Vec<&Upstream> = ups.iter().collect();
    let model = "org/model-a";
    let gw = Gateway::start(&config(model, &refs, "longest_prefix", 10)).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/sdk/responses_interop.py"
    );
    let out = python(script, &[&gw.url(""), model], None).await;
    let home = out.trim().trim_start_matches("ok ").to_owned();
    let home_up = ups.iter().find(|u| u.state.name == home).unwrap();
    let follow_ups = home_up
        .seen()
        .iter()
        .filter(|s| s.body.windows(20).any(|w| w == b"previous_response_id"))
        .count();
    assert!(
        follow_ups >= 6,
        "the follow-ups reached {home}: {follow_ups}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_with_prometheus_and_every_family_is_described_from_start_up() {
    let up = Upstream::start("u0", Mode::Json).await;
    // The recorder is the process's: an endpoint of its own keeps other tests' counts out.
    let cfg =
        config(MODEL, &[&up], "prefix_aware", 10).replace("name: chat", "name: fresh-metrics");
    let gw = Gateway::start(&cfg).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/metrics_parse.py");
    // Before any request: the per-upstream series are there already.
    let text = gw.metrics().await;
    let fresh = python(script, &[], Some(text.clone())).await;
    let upstream = format!("endpoint=\"fresh-metrics\",upstream=\"{}\"", up.url());
    for series in [
        "kvgate_time_to_first_token_seconds_count",
        "kvgate_upstream_response_headers_seconds_count",
        "kvgate_upstream_completion_tokens_total",
        "kvgate_upstream_prompt_tokens_total",
        "kvgate_upstream_cached_tokens_total",
        "kvgate_instance_healthy",
    ] {
        assert!(
            text.contains(&format!("{series}{{{upstream}}}")),
            "{series} for {upstream} missing at start-up:\n{text}"
        );
    }
    assert!(
        text.contains(
            "kvgate_requests_total{endpoint=\"fresh-metrics\",api=\"responses\",status=\"2xx\"} 0"
        ),
        "{text}"
    );
    assert!(
        fresh
            .lines()
            .any(|l| l == "kvgate_time_to_first_token_seconds"),
        "{fresh}"
    );
    // After traffic (and errors), still valid and described.
    let r = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert_eq!(r.status(), 200);
    let r = gw
        .post("/v1/embeddings", &serde_json::json!({"model": MODEL}))
        .await;
    assert_eq!(r.status(), 400);
    python(script, &[], Some(gw.metrics().await)).await;
}
