//! The whole-string fallbacks: tiny hand-written tokenizers whose added
//! tokens or pre-tokenizer make the segment split unsafe, and one where it is
//! safe, with a BOS from the post-processor.

use serde_json::json;

use crate::tests::reference;
use crate::{PromptTokenizer, Tokens};

/// A WordLevel tokenizer with a Metaspace pre-tokenizer (prepend_scheme
/// `scheme`), a BOS template and one added token given as `added`.
fn tiny(scheme: &str, added: &str) -> PromptTokenizer {
    let json = format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{added}],
        "normalizer": null,
        "pre_tokenizer": {{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "{scheme}", "split": true}},
        "post_processor": {{"type": "TemplateProcessing", "single": [{{"SpecialToken": {{"id": "<s>", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}}],
            "pair": [{{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}}],
            "special_tokens": {{"<s>": {{"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}}}},
        "decoder": null,
        "model": {{"type": "WordLevel", "vocab": {{"<s>": 0, "▁a": 1, "a": 2, "<unk>": 3, "▁": 4, "<x>": 5}}, "unk_token": "<unk>"}}}}"#
    );
    PromptTokenizer::from_json(json.as_bytes(), None).unwrap()
}

const PLAIN_ADDED: &str = r#"{"id": 5, "content": "<x>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}"#;

#[test]
fn position_dependent_tokenizers_encode_whole_strings() {
    // "first" prepends ▁ only at offset 0 of the whole string: a piece after
    // an added token must not get one.
    let first = tiny("first", PLAIN_ADDED);
    assert!(!first.backend.segmented());
    assert_eq!(first.encode("a<x>a", false), vec![1, 5, 2]);
    let always = tiny("always", PLAIN_ADDED);
    assert!(always.backend.segmented());
    assert_eq!(always.encode("a<x>a", false), vec![1, 5, 1]);
    // The BOS the post-processor adds is found and kept on the fast path.
    assert_eq!(always.encode("a<x>a", true), vec![0, 1, 5, 1]);
    assert_eq!(
        always.completion(&json!("a<x>a"), 2).unwrap(),
        Tokens {
            ids: vec![0, 1],
            truncated: true
        }
    );
    let lstrip = tiny(
        "always",
        &PLAIN_ADDED.replace(r#""lstrip": false"#, r#""lstrip": true"#),
    );
    assert!(!lstrip.backend.segmented());
    assert_eq!(
        lstrip.encode("a <x>a", false),
        reference(&lstrip, "a <x>a", false)
    );
}
