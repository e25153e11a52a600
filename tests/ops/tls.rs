//! `https://` instances: served, probed and learned from over TLS by the one
//! upstream client, verified against the configured CA and nothing else.

use std::sync::atomic::Ordering;

use super::*;

/// A test CA's PEM in a file of its own, for `upstream.tls.ca_file`.
fn ca_file(name: &str, pem: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("kvgate-{name}-{}.pem", std::process::id()));
    std::fs::write(&path, pem).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_instances_are_served_probed_and_verified_against_the_configured_ca() {
    let (up, ca) = Upstream::start_tls("tls", Mode::Json).await;
    assert!(up.url().starts_with("https://"));
    let path = ca_file("tls-ca", &ca);
    let base = with_health(config(MODEL, &[&up], "longest_prefix", 10));
    let trusted = format!(
        "{base}upstream:\n  tls:\n    ca_file: \"{}\"\n",
        path.display()
    );
    let gw = Gateway::start(&trusted).await;
    // Health checks and the capacity probe reach it over TLS with the same client.
    let inst = gw.instances()[0].clone();
    eventually("a probe over TLS confirms it", || inst.confirmed()).await;
    eventually("the capacity probe read its /metrics", || {
        up.state.metrics_reads.load(Ordering::SeqCst) > 0
    })
    .await;
    let r = gw.chat(&chat_body(MODEL, "sys", "q", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(served_by(&r), "tls");
    let streamed = gw.chat(&chat_body(MODEL, "sys", "q", true)).await;
    assert_eq!(streamed.status(), 200);

    // The system's roots alone do not know the test CA: the handshake fails,
    // the client gets kvgate's own error, and no request reaches the instance.
    // (The first gateway's health checks keep arriving: count requests only.)
    let requests = || {
        up.seen()
            .iter()
            .filter(|s| s.path == "/v1/chat/completions")
            .count()
    };
    let hits = requests();
    let untrusted = Gateway::start(&config(MODEL, &[&up], "prefix_aware", 10)).await;
    let r = untrusted.chat(&chat_body(MODEL, "sys", "q", false)).await;
    assert!(matches!(r.status().as_u16(), 502 | 503), "{}", r.status());
    assert_eq!(
        requests(),
        hits,
        "an unverified instance was sent a request"
    );

    // With system_roots: false the CA file is the only trust, and must be there.
    let only = format!(
        "{base}upstream:\n  tls:\n    ca_file: \"{}\"\n    system_roots: false\n",
        path.display()
    );
    let gw_only = Gateway::start(&only).await;
    let r = gw_only.chat(&chat_body(MODEL, "sys", "q", false)).await;
    assert_eq!(r.status(), 200);
    std::fs::remove_file(&path).unwrap();
    let err = kvgate::Config::from_yaml(&only).unwrap_err().to_string();
    assert!(err.contains("upstream.tls.ca_file"), "{err}");
    let nothing = format!("{base}upstream:\n  tls:\n    system_roots: false\n");
    let err = kvgate::Config::from_yaml(&nothing).unwrap_err().to_string();
    assert!(err.contains("upstream.tls.system_roots"), "{err}");
    let empty = ca_file("tls-empty", "not a certificate\n");
    let err = kvgate::Config::from_yaml(&format!(
        "{base}upstream:\n  tls:\n    ca_file: \"{}\"\n",
        empty.display()
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("no PEM certificate"), "{err}");
    std::fs::remove_file(&empty).unwrap();
}
