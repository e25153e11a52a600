//! Arbitrary bytes as the body of every API, through exactly what the
//! canonicalise and admission layers run: strict parsing, window extraction,
//! routing key, and the upstream cache salt. Must never panic, and memory
//! must stay bounded by the input (`-rss_limit_mb` catches a blow-up).
#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use kvgate_prefix::Api;
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = "endpoints:\n  - name: chat\n    models: [\"m\"]\n    instances: [{ url: \"http://127.0.0.1:9\" }]\n";

fn runtime() -> Option<&'static kvgate::Runtime> {
    static RT: OnceLock<Option<kvgate::Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        let config = kvgate::Config::from_yaml(CONFIG).ok()?;
        kvgate::Runtime::build(config, None).ok()
    })
    .as_ref()
}

fuzz_target!(|data: &[u8]| {
    let Some(rt) = runtime() else { return };
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    for api in [Api::Chat, Api::Completions, Api::Messages, Api::Native] {
        let body = Bytes::copy_from_slice(data);
        match kvgate::request::analyse(rt, api, Some("chat"), &headers, body, "tenant") {
            Err(e) => assert!(e.status().is_client_error(), "{api:?}: {e}"),
            Ok(a) if api != Api::Native => {
                let salted =
                    kvgate::tenancy::salt::apply(&a.input.body, "salt", a.input.has_cache_salt);
                let salted =
                    salted.unwrap_or_else(|e| panic!("salting an admitted body failed: {e}"));
                let v = kvgate_prefix::parse_strict(&salted)
                    .unwrap_or_else(|e| panic!("salted body is not JSON: {e}"));
                assert_eq!(v["cache_salt"].as_str(), Some("salt"));
            }
            Ok(_) => {}
        }
    }
});
