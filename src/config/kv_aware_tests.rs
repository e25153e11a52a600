//! The kv_aware keys: loading, joining ports to hosts, and errors that name the key.
use crate::config::Config;
use kvgate_routing::Strategy;

fn yaml(routing: &str, instance: &str) -> String {
    let tok = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/smollm2/tokenizer.json"
    );
    let routing = routing.replace("TOK", tok);
    format!(
        "endpoints:\n  - name: kv\n    models: [m]\n    instances:\n      - {{ url: \"http://10.0.0.5:8000\"{instance} }}\n    routing:\n{routing}"
    )
}

fn err(y: &str) -> String {
    match Config::from_yaml(y) {
        Ok(_) => panic!("accepted:\n{y}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn kv_aware_loads_its_tokenizer_and_joins_ports_to_hosts() {
    let c = Config::from_yaml(&yaml(
        "      strategy: kvaware\n      tokenizer: TOK\n      kv_events_port: 5557\n",
        "",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let ep = &c.endpoints[0];
    assert_eq!(ep.routing.strategy, Strategy::KvAware);
    let kv = ep
        .routing
        .kv
        .as_ref()
        .unwrap_or_else(|| panic!("no kv settings"));
    assert_eq!(kv.block_size, 16);
    assert!(kv.tokenizer.has_chat_template());
    assert_eq!(
        ep.instances[0].kv_events.as_deref(),
        Some("tcp://10.0.0.5:5557")
    );
    assert_eq!(ep.instances[0].kv_replay, None);
    let own = Config::from_yaml(&yaml(
        "      strategy: kv_aware\n      tokenizer: TOK\n      kv_events_port: 5557\n",
        ", kv_events: \"tcp://pub:1\"",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        own.endpoints[0].instances[0].kv_events.as_deref(),
        Some("tcp://pub:1")
    );
}

#[test]
fn a_tiktoken_encoding_can_stand_for_a_file() {
    let c = Config::from_yaml(&yaml(
        "      strategy: kv_aware\n      tokenizer: \"tiktoken:o200k_harmony\"\n",
        "",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let kv = c.endpoints[0]
        .routing
        .kv
        .as_ref()
        .unwrap_or_else(|| panic!("no kv"));
    assert_eq!(kv.tokenizer.name(), "tiktoken:o200k_harmony");
    assert!(!kv.tokenizer.encode("Hello, world", false).is_empty());
}

#[test]
fn kv_aware_mistakes_name_the_key() {
    let e = err(&yaml("      strategy: kv_aware\n", ""));
    assert!(e.contains("routing.tokenizer"), "{e}");
    let e = err(&yaml(
        "      strategy: kv_aware\n      tokenizer: /nonexistent/tokenizer.json\n",
        "",
    ));
    assert!(
        e.contains("routing.tokenizer") && e.contains("/nonexistent"),
        "{e}"
    );
    let e = err(&yaml(
        "      strategy: kv_aware\n      tokenizer: \"tiktoken:nope\"\n",
        "",
    ));
    assert!(e.contains("routing.tokenizer"), "{e}");
    let e = err(&yaml(
        "      strategy: kv_aware\n      tokenizer: TOK\n",
        ", kv_events: \"http://10.0.0.5:5557\"",
    ));
    assert!(
        e.contains("instances[0].kv_events") && e.contains("tcp://"),
        "{e}"
    );
    let e = err(&yaml(
        "      strategy: kv_aware\n      tokenizer: TOK\n      block_size: 0\n",
        "",
    ));
    assert!(e.contains("block_size"), "{e}");
    let e = err(&yaml(
        "      strategy: kv_aware\n      tokenizer: TOK\n      cpu_tier_weight: 1.5\n",
        "",
    ));
    assert!(e.contains("cpu_tier_weight"), "{e}");
    let e = err(&yaml(
        "      strategy: longest_prefix\n      tokenizer: TOK\n",
        "",
    ));
    assert!(
        e.contains("routing.tokenizer") && e.contains("only the kv_aware"),
        "{e}"
    );
    let e = err(&yaml(
        "      strategy: longest_prefix\n",
        ", kv_events: \"tcp://a:1\"",
    ));
    assert!(e.contains("kv_events"), "{e}");
    let e = err(&yaml(
        "      strategy: longest_prefix\n      warmup: { prefixes: 5000 }\n",
        "",
    ));
    assert!(e.contains("warmup.prefixes"), "{e}");
}

/// What `kvgate check` prints for the tokenizer, for a config naming `tokenizer`.
fn described(tokenizer: &str) -> String {
    let routing = format!("      strategy: kv_aware\n      tokenizer: \"{tokenizer}\"\n");
    let c = Config::from_yaml(&yaml(&routing, "")).unwrap_or_else(|e| panic!("{e}"));
    let kv = c.endpoints[0].routing.kv.as_ref();
    kv.unwrap_or_else(|| panic!("no kv")).describe_tokenizer()
}

#[test]
fn check_names_the_chat_template_jinja_transformers_saves_today() {
    // A model folder as transformers writes it: the template in
    // chat_template.jinja, none in tokenizer_config.json.
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/smollm2");
    let dir = std::env::temp_dir().join(format!("kvgate-check-jinja-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let config =
        std::fs::read(fixture.join("tokenizer_config.json")).unwrap_or_else(|e| panic!("{e}"));
    let mut config: serde_json::Value =
        serde_json::from_slice(&config).unwrap_or_else(|e| panic!("{e}"));
    let template = config
        .as_object_mut()
        .and_then(|c| c.remove("chat_template"))
        .unwrap_or_else(|| panic!("the fixture has a chat_template"));
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(dir.join(name), bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    };
    write("tokenizer_config.json", config.to_string().as_bytes());
    write(
        "chat_template.jinja",
        template.as_str().unwrap_or_default().as_bytes(),
    );
    std::fs::copy(fixture.join("tokenizer.json"), dir.join("tokenizer.json"))
        .unwrap_or_else(|e| panic!("{e}"));

    let tokenizer = dir.join("tokenizer.json").display().to_string();
    let line = described(&tokenizer);
    let jinja = dir.join("chat_template.jinja").display().to_string();
    assert_eq!(
        line,
        format!("tokenizer {tokenizer} with chat template {jinja}")
    );
    let _ = std::fs::remove_dir_all(&dir);

    let string_form = fixture.join("tokenizer.json").display().to_string();
    assert!(
        described(&string_form).ends_with("fixtures/smollm2/tokenizer_config.json"),
        "{}",
        described(&string_form)
    );
    let none = described("tiktoken:o200k_base");
    assert!(
        none.contains("no chat template") && none.contains("routing.chat_template"),
        "{none}"
    );
}
