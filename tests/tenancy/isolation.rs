//! Tenants kept apart: identical prompts with an identical `prompt_cache_key`
//! are placed independently per tenant and reach the upstream with different
//! cache salts; a client cannot choose its salt; the salt is the only change
//! made to a body, on OpenAI and native routes alike.

use std::collections::HashMap;

use super::*;

async fn fleet(n: usize) -> Vec<Upstream> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Upstream::start(&format!("u{i}"), Mode::Json).await);
    }
    v
}

/// Every body the fleet saw, parsed, keyed by the user message it carried.
fn seen_by_question(ups: &[Upstream]) -> HashMap<String, Vec<(Value, Vec<u8>)>> {
    let mut out: HashMap<String, Vec<(Value, Vec<u8>)>> = HashMap::new();
    for u in ups {
        for s in u.seen() {
            let v: Value = serde_json::from_slice(&s.body).unwrap();
            let q = v["messages"][1]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            out.entry(q).or_default().push((v, s.body.to_vec()));
        }
    }
    out
}

fn salt_of(v: &Value) -> String {
    v["cache_salt"]
        .as_str()
        .expect("no cache_salt upstream")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_prompts_of_two_tenants_are_placed_and_salted_independently() {
    let ups = fleet(4).await;
    let refs: Vec<&Upstream> = ups.iter().collect();
    let gw = Gateway::start(&jwt_config(&refs, "")).await;
    let (a, b) = (hs256(&claims("tenant-a")), hs256(&claims("tenant-b")));
    let mut differ = 0;
    for topic in 0..40 {
        let mut placed = Vec::new();
        for (name, token) in [("a", &a), ("b", &b), ("a", &a)] {
            let mut body = chat_body(
                MODEL,
                &system_prompt(topic),
                &format!("{name} {topic}"),
                false,
            );
            body["prompt_cache_key"] = json!("shared-key");
            let resp = chat(&gw, token, &body).await;
            assert_eq!(resp.status(), 200);
            placed.push(served_by(&resp));
        }
        assert_eq!(
            placed[0], placed[2],
            "tenant a's topic {topic} moved between identical requests"
        );
        differ += usize::from(placed[0] != placed[1]);
    }
    // Independent placement over 4 instances differs for ~3/4 of topics; the
    // same placement for all 40 would mean the tenant did not salt the key.
    assert!(
        differ >= 10,
        "only {differ} of 40 topics placed differently for two tenants"
    );

    let seen = seen_by_question(&ups);
    let salt = |q: &str| seen[q].iter().map(|(v, _)| salt_of(v)).collect::<Vec<_>>();
    let salt_a = salt("a 0")[0].clone();
    let salt_b = salt("b 0")[0].clone();
    assert_ne!(salt_a, salt_b, "two tenants share an upstream cache salt");
    assert!(
        !salt_a.contains("tenant-a"),
        "the salt reveals the tenant id"
    );
    for topic in 0..40 {
        assert!(
            salt(&format!("a {topic}")).iter().all(|s| *s == salt_a),
            "tenant a's salt changed"
        );
        assert!(
            salt(&format!("b {topic}")).iter().all(|s| *s == salt_b),
            "tenant b's salt changed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_supplied_cache_salt_is_replaced() {
    let ups = fleet(3).await;
    let refs: Vec<&Upstream> = ups.iter().collect();
    let gw = Gateway::start(&jwt_config(&refs, "")).await;
    let (a, b) = (hs256(&claims("tenant-a")), hs256(&claims("tenant-b")));
    // Learn b's salt the way a curious operator would: from the upstream.
    assert_eq!(chat(&gw, &b, &small_chat("b-probe")).await.status(), 200);
    let salt_b = salt_of(&seen_by_question(&ups)["b-probe"][0].0);
    let plain = small_chat("plain");
    let home = served_by(&chat(&gw, &a, &plain).await);
    let sys = plain["messages"][0].clone();
    let forged = [
        json!({"model": MODEL, "cache_salt": salt_b, "messages": [sys.clone(), {"role": "user", "content": "plain"}]}),
        json!({"model": MODEL, "cache_salt": 7, "messages": [sys.clone(), {"role": "user", "content": "plain"}]}),
    ];
    for body in &forged {
        let resp = chat(&gw, &a, body).await;
        assert_eq!(resp.status(), 200);
        // Routing is keyed on the prompt, not the salt: same instance.
        assert_eq!(served_by(&resp), home);
    }
    // The same forgery with an escaped member name.
    let escaped = format!(
        r#"{{"model":"{MODEL}","cache\u005fsalt":"{salt_b}","messages":[{sys},{{"role":"user","content":"plain"}}]}}"#
    );
    assert_eq!(
        post(&gw, "/v1/chat/completions", Some(&a), escaped)
            .await
            .status(),
        200
    );
    let seen = &seen_by_question(&ups)["plain"];
    assert_eq!(seen.len(), 4);
    let salt_a = salt_of(&seen[0].0);
    for (v, raw) in seen {
        assert_eq!(salt_of(v), salt_a);
        assert!(
            !String::from_utf8_lossy(raw).contains(&salt_b),
            "b's salt was forwarded"
        );
        assert_eq!(
            v.as_object()
                .unwrap()
                .keys()
                .filter(|k| k.contains("salt"))
                .count(),
            1,
            "{v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_salt_is_the_only_change_on_every_api() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&jwt_config(&[&up], "")).await;
    let a = hs256(&claims("tenant-a"));
    let raw = format!(
        "  {{ \"model\" : \"{MODEL}\",\n \"prompt\": \"once upon\\u00e9\" , \"n\": 1.50 }}"
    );
    assert_eq!(
        post(&gw, "/v1/completions", Some(&a), raw.clone())
            .await
            .status(),
        200
    );
    // Native Invoke bodies are salted the same way: the SageMaker wire must
    // not be a way around tenant isolation.
    let native = r#"{ "inputs": "x", "parameters": {"max_new_tokens": 1.0e1} }"#;
    assert_eq!(
        post(&gw, "/endpoints/chat/invocations", Some(&a), native)
            .await
            .status(),
        200
    );
    // A native body that is not an object cannot carry a salt: untouched.
    let array = r#"[{"inputs": "y"}]"#;
    assert_eq!(
        post(&gw, "/endpoints/chat/invocations", Some(&a), array)
            .await
            .status(),
        200
    );
    let seen = up.seen();
    let v: Value = serde_json::from_slice(&seen[0].body).unwrap();
    let salt = salt_of(&v);
    let want = format!(
        "  {{\"cache_salt\":\"{salt}\", \"model\" : \"{MODEL}\",\n \"prompt\": \"once upon\\u00e9\" , \"n\": 1.50 }}"
    );
    assert_eq!(String::from_utf8_lossy(&seen[0].body), want);
    let want = format!(
        "{{\"cache_salt\":\"{salt}\", \"inputs\": \"x\", \"parameters\": {{\"max_new_tokens\": 1.0e1}} }}"
    );
    assert_eq!(String::from_utf8_lossy(&seen[1].body), want);
    assert_eq!(seen[2].body, array.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_client_cannot_send_another_tenants_salt() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = Gateway::start(&jwt_config(&[&up], "")).await;
    let (a, b) = (hs256(&claims("tenant-a")), hs256(&claims("tenant-b")));
    let plain = r#"{"inputs": "probe"}"#;
    post(&gw, "/endpoints/chat/invocations", Some(&a), plain).await;
    let a_salt = salt_of(&serde_json::from_slice(&up.seen()[0].body).unwrap());
    // Tenant b claims a's salt (and any other): replaced by b's own.
    let forged = format!(r#"{{"inputs": "probe", "cache_salt": "{a_salt}"}}"#);
    assert_eq!(
        post(&gw, "/endpoints/chat/invocations", Some(&b), forged)
            .await
            .status(),
        200
    );
    let v: Value = serde_json::from_slice(&up.seen()[1].body).unwrap();
    assert_ne!(salt_of(&v), a_salt, "{v}");
    assert_eq!(v["inputs"], "probe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salting_can_be_turned_off() {
    let up = Upstream::start("u0", Mode::Json).await;
    let yaml =
        jwt_config(&[&up], "").replace("upstream_cache_salt: true", "upstream_cache_salt: false");
    let gw = Gateway::start(&yaml).await;
    let body = serde_json::to_vec(&small_chat("x")).unwrap();
    let resp = post(
        &gw,
        "/v1/chat/completions",
        Some(&hs256(&claims("a"))),
        body.clone(),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(up.seen()[0].body, body);
}
