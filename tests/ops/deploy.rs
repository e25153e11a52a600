//! The Kubernetes manifests in deploy/, rendered by `kubectl kustomize`
//! (offline): what a rolling update and discovery need is there and agrees
//! with the config the ConfigMap carries, which `kvgate check` accepts.

use serde_json::Value;

fn render(overlay: &str) -> Vec<Value> {
    let dir = format!("{}/deploy/overlays/{overlay}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("kubectl")
        .args(["kustomize", &dir])
        .output()
        .expect("kubectl (.ci/run installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

/// The rendered resource of `kind` named `name`.
fn resource<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn the_production_overlay_renders_what_a_rolling_update_needs() {
    let docs = render("production");
    for k in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
    ] {
        kind(&docs, k);
    }
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["namespace"] == "serving" || d["kind"] == "Namespace")
    );

    let role = kind(&docs, "Role");
    let rule = &role["rules"][0];
    assert_eq!(rule["apiGroups"][0], "discovery.k8s.io");
    assert_eq!(rule["resources"][0], "endpointslices");
    for verb in ["list", "watch"] {
        assert!(
            rule["verbs"].as_array().unwrap().iter().any(|v| v == verb),
            "{verb}"
        );
    }

    let text = kind(&docs, "ConfigMap")["data"]["config.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    let config: Value = serde_saphyr::from_str(&text).unwrap();
    let grace_ms = config["server"]["shutdown_grace_ms"].as_u64().unwrap();

    let deploy = resource(&docs, "Deployment", "kvgate");
    assert_eq!(deploy["spec"]["replicas"], 3);
    // What the replicas share is configured, and its Redis is rendered
    // beside them; the gateway's Service selects no Redis pod.
    assert!(
        config["cluster"]["redis"]
            .as_str()
            .unwrap()
            .starts_with("redis://kvgate-redis:"),
        "{text}"
    );
    resource(&docs, "Deployment", "kvgate-redis");
    resource(&docs, "Service", "kvgate-redis");
    assert_eq!(
        resource(&docs, "Service", "kvgate")["spec"]["selector"]["app.kubernetes.io/component"],
        "gateway"
    );
    let pod = &deploy["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/health");
    let pre_stop: u64 = c["lifecycle"]["preStop"]["exec"]["command"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let termination = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        termination * 1000 > pre_stop * 1000 + grace_ms,
        "terminationGracePeriodSeconds {termination} s must exceed preStop {pre_stop} s + shutdown_grace_ms {grace_ms}"
    );
    let mount = &c["volumeMounts"][0];
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees ConfigMap updates"
    );
    assert_eq!(
        pod["serviceAccountName"],
        kind(&docs, "RoleBinding")["subjects"][0]["name"]
    );

    // Every secret the config takes from the environment is mapped from the Secret.
    let env: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let named: Vec<&str> = text
        .match_indices("{ env: ")
        .map(|(i, _)| text[i + 7..].split(' ').next().unwrap())
        .collect();
    assert!(!named.is_empty());
    for var in &named {
        assert!(env.contains(var), "{var} is not set by the Deployment");
    }

    // The ConfigMap's config is one kvgate accepts, given those secrets.
    let dir = std::env::temp_dir().join(format!("kvgate-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.yaml");
    std::fs::write(&path, &text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["check", "--config"])
        .arg(&path)
        .envs(
            named
                .iter()
                .map(|v| (*v, "a-test-secret-of-at-least-32-bytes-0123456789")),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("watched from kubernetes:serving/vllm:8000")
    );
    std::fs::remove_dir_all(&dir).ok();

    let monitor = kind(&docs, "ServiceMonitor");
    let port = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
    assert!(
        resource(&docs, "Service", "kvgate")["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == port)
    );
}

#[test]
fn the_single_overlay_is_one_replica_without_cluster_extras() {
    // The base runs two replicas sharing one Redis; this overlay one.
    assert_eq!(
        resource(&render("production"), "Deployment", "kvgate")["spec"]["replicas"],
        3
    );
    let docs = render("single");
    assert_eq!(
        resource(&docs, "Deployment", "kvgate")["spec"]["replicas"],
        1
    );
    assert!(
        docs.iter()
            .all(|d| d["kind"] != "HorizontalPodAutoscaler" && d["kind"] != "ServiceMonitor")
    );
}
