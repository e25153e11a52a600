//! The hand-run byte-level pre-tokenizer against the library's own encode:
//! SmolLM2's vocabulary under each pre-tokenizer shape it recognises (GPT-2's
//! ByteLevel, SmolLM2's Digits + ByteLevel, Llama 3's and Qwen 2's Split
//! patterns), on generated text dense in what the patterns tell apart.

use std::sync::LazyLock;

use proptest::prelude::*;
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::byte_level::ByteLevelBpe;
use crate::tests::FIXTURE;

const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(pattern: &str) -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
        byte_level(false),
    ]})
}

/// SmolLM2's tokenizer with another pre-tokenizer (and normalizer).
fn with(pre: Value, normalizer: Value) -> Tokenizer {
    let mut doc: Value = serde_json::from_slice(&std::fs::read(FIXTURE).unwrap()).unwrap();
    doc["pre_tokenizer"] = pre;
    doc["normalizer"] = normalizer;
    Tokenizer::from_bytes(serde_json::to_vec(&doc).unwrap()).unwrap()
}

static SHAPES: LazyLock<Vec<(&str, Tokenizer)>> = LazyLock::new(|| {
    vec![
        ("smollm2", Tokenizer::from_file(FIXTURE).unwrap()),
        ("gpt2", with(byte_level(true), Value::Null)),
        ("llama3", with(split(LLAMA3), Value::Null)),
        ("qwen2", with(split(QWEN2), json!({"type": "NFC"}))),
    ]
});

fn library(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode_fast(text, false).unwrap().get_ids().to_vec()
}

/// Runs of whitespace of every kind before and after words, digits of
/// several scripts, contractions in both cases, punctuation, CJK, emoji and
/// combining marks.
fn text_strategy() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[ \t\n\r\u{a0}\u{3000}\u{2028}\u{b}\u{c}\u{85}\u{1680}\u{2000}\u{202f}]{1,5}",
        "[\u{0}-\u{8}\u{1c}-\u{1f}\u{7f}\u{200b}\u{feff}]{1,3}",
        "[a-zA-Z]{1,8}",
        "[0-9\u{663}\u{216b}\u{bd}]{1,5}",
        "('s|'S|'t|'re|'VE|'m|'ll|'d|'x|')",
        "[!-/:-@\\[-`{-~]{1,4}",
        "[éжΩ中文😀\u{301}_]{1,4}",
        "\\PC{1,6}",
    ];
    prop::collection::vec(piece, 0..16).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn gives_the_library_ids_on_every_recognised_shape(text in text_strategy()) {
        for (name, tok) in SHAPES.iter() {
            let fast = ByteLevelBpe::recognise(tok).unwrap();
            if fast.applies(&text) {
                prop_assert_eq!(fast.encode(tok, &text).unwrap(), library(tok, &text), "{}", name);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// ASCII alone, so that the NFC shape (Qwen 2) is exercised as often.
    #[test]
    fn gives_the_library_ids_on_ascii_text(text in "[ -~\t\n\r]{0,80}") {
        for (name, tok) in SHAPES.iter() {
            let fast = ByteLevelBpe::recognise(tok).unwrap();
            prop_assert!(fast.applies(&text));
            prop_assert_eq!(fast.encode(tok, &text).unwrap(), library(tok, &text), "{}", name);
        }
    }
}

/// Whitespace runs long enough to exhaust fancy-regex's backtracking stack
/// are left to the library (which then leaves the rest unsplit): same ids.
#[test]
fn leaves_huge_whitespace_runs_to_the_library() {
    let (_, tok) = &SHAPES[1];
    let fast = ByteLevelBpe::recognise(tok).unwrap();
    let text = format!("a{}b", " ".repeat(120_000));
    assert!(fast.encode(tok, &text).is_err());
    let backend = crate::backend::Backend::new(crate::backend::Model::Hf(Box::new(tok.clone())));
    assert_eq!(
        backend.encode(&text, false, usize::MAX).unwrap().ids,
        library(tok, &text)
    );
}

#[test]
fn gives_the_library_ids_on_code_logs_and_prose() {
    let texts = [
        "fn main() {\n    let x = 42;\n\n    if x > 1 {\n\t\treturn;\n    }\n}\n",
        "test tests::it_works ... ok\ntest result: FAILED. 12 passed; 3 failed; 0 ignored\n   \n",
        "  leading, trailing  \n\n\n  and  between words   ",
        "She's sure they'll say we'd've DONE it; I'M not. '' 'tis\r\n\r\nEnd",
        "数字は１２３、٣٤٥ and ½ Ⅻ; naïve café — “quoted” …",
    ];
    for (name, tok) in SHAPES.iter() {
        let fast = ByteLevelBpe::recognise(tok).unwrap();
        for text in texts.iter().filter(|t| fast.applies(t)) {
            assert_eq!(
                fast.encode(tok, text).unwrap(),
                library(tok, text),
                "{name}: {text:?}"
            );
        }
    }
}

#[test]
fn takes_nfc_tokenizers_on_ascii_text_only() {
    let qwen = &SHAPES[3].1;
    let fast = ByteLevelBpe::recognise(qwen).unwrap();
    assert!(fast.applies("plain ASCII\n"));
    assert!(!fast.applies("cafe\u{301}"));
}

#[test]
fn leaves_other_pipelines_to_the_library() {
    let prefix_space = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    let metaspace =
        json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true});
    let other_lookahead = split(r"\w+(?=\s)|\s+(?!\S)|\s+");
    let unknown_tail = split(r"\w+|\s+");
    let empty_head = split(r"\w*|\s+(?!\S)|\s+");
    for pre in [
        prefix_space,
        metaspace,
        other_lookahead,
        unknown_tail,
        empty_head,
    ] {
        assert!(
            ByteLevelBpe::recognise(&with(pre.clone(), Value::Null)).is_none(),
            "{pre}"
        );
    }
    let lowercase = with(byte_level(true), json!({"type": "Lowercase"}));
    assert!(ByteLevelBpe::recognise(&lowercase).is_none());
}
