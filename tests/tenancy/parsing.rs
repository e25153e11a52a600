//! Property tests: no byte string makes request parsing or salting panic or
//! answer 5xx, and every admitted OpenAI body salts into valid JSON. The same
//! check runs under libFuzzer in `fuzz/fuzz_targets/analyse.rs`.

use bytes::Bytes;
use kvgate_prefix::Api;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};

use super::*;

fn runtime() -> kvgate::Runtime {
    let yaml = "endpoints:\n  - name: chat\n    models: [\"test-model\"]\n    instances: [{ url: \"http://127.0.0.1:9\" }]\n";
    kvgate::Runtime::build(kvgate::Config::from_yaml(yaml).unwrap(), None).unwrap()
}

/// Parse `body` as each API; never a panic or a 5xx, and every admitted
/// OpenAI body still salts into valid JSON with exactly our salt.
fn check(rt: &kvgate::Runtime, body: &[u8]) -> Result<(), TestCaseError> {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    for api in [Api::Chat, Api::Completions, Api::Messages, Api::Native] {
        match kvgate::request::analyse(
            rt,
            api,
            Some("chat"),
            &headers,
            Bytes::copy_from_slice(body),
            "t",
        ) {
            Err(e) => prop_assert!(e.status().is_client_error(), "{api:?}: {e}"),
            Ok(a) if api != Api::Native => {
                let out =
                    kvgate::tenancy::salt::apply(&a.input.body, "s4lt", a.input.has_cache_salt)
                        .unwrap();
                let v = kvgate_prefix::parse_strict(&out).unwrap();
                prop_assert_eq!(v["cache_salt"].as_str(), Some("s4lt"));
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

#[test]
fn no_bytes_make_parsing_or_salting_panic() {
    let rt = runtime();
    let cfg = RunnerConfig {
        cases: 512,
        failure_persistence: None,
        ..RunnerConfig::default()
    };
    let mut runner = TestRunner::new(cfg.clone());
    runner
        .run(&prop::collection::vec(any::<u8>(), 0..512), |b| {
            check(&rt, &b)
        })
        .unwrap();
    // JSON-ish text reaches further than random bytes.
    let mut runner = TestRunner::new(cfg.clone());
    runner
        .run(&"[\\[\\]{}\",:0-9a-z\\\\ .eE+-]{0,256}", |s| {
            check(&rt, s.as_bytes())
        })
        .unwrap();
    // Well-formed requests with arbitrary text, keys and salts.
    let mut runner = TestRunner::new(cfg);
    let request = (
        any::<String>(),
        any::<String>(),
        prop::option::of(any::<String>()),
        any::<bool>(),
    );
    runner
        .run(&request, |(text, key, salt, chat)| {
            let mut v = if chat {
                json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "prompt_cache_key": key})
            } else {
                json!({"model": MODEL, "prompt": text, "prompt_cache_key": key})
            };
            if let Some(s) = salt {
                v["cache_salt"] = json!(s);
            }
            check(&rt, &serde_json::to_vec(&v).unwrap())
        })
        .unwrap();
}
