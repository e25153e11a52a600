//! Unit tests of the public API on the SmolLM2 fixture, tiktoken encodings and
//! tiny hand-written tokenizers that exercise the whole-string fallbacks.

use proptest::prelude::*;
use serde_json::json;

use super::*;

pub(crate) const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../fixtures/smollm2/tokenizer.json"
);

/// Loaded once: parsing the 1.5 MB fixture dominates a debug-build test case.
static SMOLLM2: std::sync::LazyLock<std::sync::Arc<PromptTokenizer>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(PromptTokenizer::load(FIXTURE, None).unwrap()));
static HARMONY: std::sync::LazyLock<PromptTokenizer> =
    std::sync::LazyLock::new(|| PromptTokenizer::tiktoken("o200k_harmony", None).unwrap());

fn smollm2() -> std::sync::Arc<PromptTokenizer> {
    std::sync::Arc::clone(&SMOLLM2)
}

/// Whole-string encode by the library itself, the reference for the cache path.
pub(crate) fn reference(t: &PromptTokenizer, text: &str, add_special: bool) -> Vec<u32> {
    t.backend.encode_whole(text, add_special).unwrap()
}

fn text_strategy() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<|im_start|>".to_owned()),
        Just("<|im_end|>".to_owned()),
        Just("<|endoftext|>".to_owned()),
        Just("<|start|>".to_owned()),
        Just("<|end|>".to_owned()),
        Just("<|im_start".to_owned()),
        "[ \t\n]{1,4}",
        "[0-9]{1,6}",
        "[a-zA-Z]{1,12}",
        "[ -~]{1,20}",
        "\\PC{1,8}",
        "(fn|let|if|<|>|\\{|\\}|;|'s|'ll){1,4}",
    ];
    prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn segment_cached_encode_is_whole_string_encode(text in text_strategy(), add_special: bool) {
        let hf = smollm2();
        prop_assert!(hf.backend.segmented());
        // Twice: the second pass reads the cache the first one filled.
        prop_assert_eq!(hf.encode(&text, add_special), reference(&hf, &text, add_special));
        prop_assert_eq!(hf.encode(&text, add_special), reference(&hf, &text, add_special));
        let tk = &*HARMONY;
        prop_assert!(tk.backend.segmented());
        prop_assert_eq!(tk.encode(&text, false), reference(tk, &text, false));
    }

    #[test]
    fn limit_gives_a_prefix_and_says_truncated(text in text_strategy(), limit in 0usize..40) {
        let t = smollm2();
        let full = t.encode(&text, true);
        let got = t.completion(&json!(text), limit).unwrap();
        prop_assert_eq!(&got.ids[..], &full[..full.len().min(limit)]);
        prop_assert_eq!(got.truncated, full.len() > limit);
    }
}

#[test]
fn renders_smollm2_chat_as_its_template_says() {
    let t = smollm2();
    assert!(t.has_chat_template());
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let expected = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
                    <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(t.render_chat(&body).unwrap(), expected);
    let ids = t.chat(&body, usize::MAX).unwrap();
    assert_eq!(ids.ids, reference(&t, expected, false));
    assert_eq!(ids.ids[0], 1, "<|im_start|> is one special id");
    assert!(!ids.truncated);
    let no_gen = json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"add_generation_prompt": false}});
    assert!(!t.render_chat(&no_gen).unwrap().ends_with("assistant\n"));
}

#[test]
fn chat_limit_truncates_at_exactly_limit() {
    let t = smollm2();
    let body = json!({"messages": [{"role": "system", "content": "Be brief. ".repeat(50)}, {"role": "user", "content": "hi"}]});
    let full = t.chat(&body, usize::MAX).unwrap().ids;
    let cut = t.chat(&body, 10).unwrap();
    assert_eq!((cut.ids.as_slice(), cut.truncated), (&full[..10], true));
    let exact = t.chat(&body, full.len()).unwrap();
    assert_eq!((exact.ids, exact.truncated), (full.clone(), false));
    assert_eq!(
        t.chat(&body, 0).unwrap(),
        Tokens {
            ids: vec![],
            truncated: true
        }
    );
}

#[test]
fn content_parts_flatten_to_text_joined_by_newlines() {
    let t = smollm2();
    let parts = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "b"}
    ]}]});
    let plain = json!({"messages": [{"role": "user", "content": "a\nb"}]});
    assert_eq!(
        t.render_chat(&parts).unwrap(),
        t.render_chat(&plain).unwrap()
    );
    let null = json!({"messages": [{"role": "assistant", "content": null}]});
    assert!(
        t.render_chat(&null)
            .unwrap()
            .contains("<|im_start|>assistant\n<|im_end|>")
    );
}

#[test]
fn tools_and_tool_calls_reach_the_template() {
    let template = "{% for t in tools %}{{ t | tojson }}\n{% endfor %}\
                    {% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments.city }}{% endfor %}{% endfor %}";
    let t = PromptTokenizer::tiktoken("o200k_base", Some(template.into())).unwrap();
    let body = json!({
        "messages": [{"role": "assistant", "content": null, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]}],
        "tools": [{"function": {"description": "<weather> & 'more'", "name": "w"}, "type": "function"}]
    });
    assert_eq!(
        t.render_chat(&body).unwrap(),
        // vLLM's field order and its nulls for absent optional fields; no HTML escaping.
        "{\"type\": \"function\", \"function\": {\"name\": \"w\", \"description\": \"<weather> & 'more'\", \"parameters\": null}}\nParis"
    );
}

#[test]
fn bad_bodies_are_errors_not_panics() {
    let t = smollm2();
    let bad = [
        json!([]),
        json!({}),
        json!({"messages": "hi"}),
        json!({"messages": [1]}),
        json!({"messages": [{"content": "no role"}]}),
        json!({"messages": [{"role": 3, "content": "x"}]}),
        json!({"messages": [{"role": "user", "content": 5}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
        json!({"messages": [{"role": "user", "content": "x"}], "tools": {}}),
        json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
        json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": 1}}]}),
        json!({"messages": [{"role": "user", "content": "x", "tool_calls": 1}]}),
        json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 1}),
    ];
    for body in bad {
        assert!(
            matches!(t.chat(&body, 100), Err(TokenizeError::BadMessages(_))),
            "{body}"
        );
    }
    let raises = PromptTokenizer::tiktoken(
        "cl100k_base",
        Some("{{ raise_exception('no system role') }}".into()),
    )
    .unwrap();
    let err = raises.chat(&json!({"messages": []}), 10).unwrap_err();
    assert!(
        matches!(&err, TokenizeError::Template(m) if m.contains("no system role")),
        "{err}"
    );
    let none = PromptTokenizer::tiktoken("cl100k_base", None).unwrap();
    assert!(matches!(
        none.chat(&json!({"messages": []}), 10),
        Err(TokenizeError::NoChatTemplate)
    ));
    for prompt in [
        json!({}),
        json!([]),
        json!([-1]),
        json!([1.5]),
        json!([4294967296u64]),
        json!([{}]),
        json!(null),
    ] {
        assert!(
            matches!(t.completion(&prompt, 10), Err(TokenizeError::BadPrompt(_))),
            "{prompt}"
        );
    }
}

#[test]
fn completion_prompt_forms() {
    let t = smollm2();
    let ids = t.encode("Hello world", true);
    assert_eq!(t.completion(&json!("Hello world"), 100).unwrap().ids, ids);
    assert_eq!(
        t.completion(&json!(["Hello world", "ignored"]), 100)
            .unwrap()
            .ids,
        ids
    );
    assert_eq!(
        t.completion(&json!([5, 6, 7]), 100).unwrap().ids,
        vec![5, 6, 7]
    );
    assert_eq!(
        t.completion(&json!([[5, 6, 7], [8]]), 2).unwrap(),
        Tokens {
            ids: vec![5, 6],
            truncated: true
        }
    );
}

#[test]
fn tiktoken_specs_load_and_parse_special_tokens() {
    let t = PromptTokenizer::load("tiktoken:o200k_harmony", None).unwrap();
    assert_eq!(t.name(), "tiktoken:o200k_harmony");
    assert!(!t.has_chat_template());
    let ids = t.encode("<|start|>user<|message|>hi<|end|>", false);
    assert_eq!(
        (ids[0], ids[2], ids[ids.len() - 1]),
        (200006, 200008, 200007)
    );
    assert!(
        matches!(PromptTokenizer::load("tiktoken:nope", None), Err(LoadError::UnknownEncoding(e)) if e == "nope")
    );
    for enc in ["o200k_base", "cl100k_base", "p50k_base", "r50k_base"] {
        assert!(
            !PromptTokenizer::tiktoken(enc, None)
                .unwrap()
                .encode("hi", true)
                .is_empty()
        );
    }
}

#[test]
fn load_errors_name_the_file_and_explicit_templates_win() {
    let err = PromptTokenizer::load("/nonexistent/tokenizer.json", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
    let dir = std::env::temp_dir().join(format!("kvgate-tokenize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let template = dir.join("t.jinja");
    std::fs::write(&template, "{{ bos_token }}[{{ messages[0].content }}]").unwrap();
    let t = PromptTokenizer::load(FIXTURE, Some(&template)).unwrap();
    assert_eq!(
        t.render_chat(&json!({"messages": [{"role": "user", "content": "x"}]}))
            .unwrap(),
        "<|im_start|>[x]"
    );
    std::fs::write(&template, "{% for %}").unwrap();
    let err = PromptTokenizer::load(FIXTURE, Some(&template))
        .unwrap_err()
        .to_string();
    assert!(err.contains("t.jinja"), "{err}");
    std::fs::write(dir.join("tokenizer.json"), b"{ not json").unwrap();
    let err = PromptTokenizer::load(dir.join("tokenizer.json").to_str().unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(matches!(
        PromptTokenizer::from_json(b"{}", None),
        Err(LoadError::Tokenizer { .. })
    ));
    let json = std::fs::read(FIXTURE).unwrap();
    assert!(matches!(
        PromptTokenizer::from_json(&json, Some(b"[]")),
        Err(LoadError::Config { .. })
    ));
    assert!(
        PromptTokenizer::from_json(&json, None)
            .unwrap()
            .render_chat(&json!({"messages": []}))
            .is_err()
    );
}

#[test]
fn shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + std::fmt::Debug>() {}
    assert_send_sync::<PromptTokenizer>();
    let t = smollm2();
    let text = "A long system prompt that repeats. ".repeat(20);
    let want = reference(&t, &text, false);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (t, text) = (std::sync::Arc::clone(&t), text.clone());
            std::thread::spawn(move || t.encode(&text, false))
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), want);
    }
    assert!(format!("{t:?}").contains("cached_segments"));
}
