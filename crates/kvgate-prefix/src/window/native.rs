//! The window of a native (SageMaker Invoke) body: a byte prefix of its canonical
//! JSON with the prompt-bearing members hoisted to the front.
//!
//! Plain RFC 8785 order would sort `max_tokens` or `parameters` ahead of
//! `prompt`, so two requests sharing a long prompt but not their sampling
//! parameters would get different windows and land on different caches.

use serde_json::{Map, Value};

use crate::canonical::{cmp_utf16, write_members, write_until};

/// Top-level members that carry the prompt in common model containers (OpenAI
/// style, TGI/HF `inputs`, embeddings `input`, JumpStart `text_inputs`), in the
/// order they are hoisted.
pub const DEFAULT_PROMPT_MEMBERS: &[&str] =
    &["messages", "prompt", "inputs", "input", "text_inputs"];

/// [`DEFAULT_PROMPT_MEMBERS`] in the owned form [`native_window`] takes.
pub fn default_prompt_members() -> Vec<String> {
    DEFAULT_PROMPT_MEMBERS
        .iter()
        .map(|&m| m.to_owned())
        .collect()
}

/// The first `max_bytes` bytes of `body`'s canonical JSON, except that a
/// top-level object lists the members named in `prompt_members` first (in that
/// order; absent ones skipped, repeats ignored), then the rest in RFC 8785
/// order. Anything below the top level, and any non-object body, is plain
/// RFC 8785. Members wholly past the window are not serialised.
pub fn native_window(body: &Value, prompt_members: &[String], max_bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    match body {
        Value::Object(map) => write_hoisted(map, prompt_members, max_bytes, &mut out),
        other => write_until(other, &mut out, max_bytes),
    }
    out.truncate(max_bytes);
    out
}

fn write_hoisted(
    map: &Map<String, Value>,
    prompt_members: &[String],
    max_bytes: usize,
    out: &mut Vec<u8>,
) {
    let mut hoisted: Vec<(&String, &Value)> = Vec::with_capacity(prompt_members.len());
    for name in prompt_members {
        if let Some((key, value)) = map.get_key_value(name)
            && !hoisted.iter().any(|(k, _)| *k == key)
        {
            hoisted.push((key, value));
        }
    }
    let mut rest: Vec<(&String, &Value)> = map
        .iter()
        .filter(|(key, _)| !prompt_members.contains(key))
        .collect();
    // Sorted here, not trusted from the map: serde_json's `preserve_order`
    // feature, if anything in the build turns it on, keeps insertion order.
    rest.sort_unstable_by(|a, b| cmp_utf16(a.0, b.0));

    write_members(hoisted.into_iter().chain(rest), out, max_bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::write_canonical;
    use serde_json::json;

    fn window(body: &Value, max: usize) -> String {
        String::from_utf8(native_window(body, &default_prompt_members(), max)).unwrap()
    }

    #[test]
    fn prompt_members_come_first_in_configured_order() {
        let body = json!({"parameters": {"top_p": 0.9, "max_new_tokens": 5}, "inputs": "hi", "messages": [], "a": 1});
        assert_eq!(
            window(&body, usize::MAX),
            r#"{"messages":[],"inputs":"hi","a":1,"parameters":{"max_new_tokens":5,"top_p":0.9}}"#
        );
        let custom = vec![
            "a".to_owned(),
            "inputs".to_owned(),
            "a".to_owned(),
            "absent".to_owned(),
        ];
        assert_eq!(
            String::from_utf8(native_window(&body, &custom, usize::MAX)).unwrap(),
            r#"{"a":1,"inputs":"hi","messages":[],"parameters":{"max_new_tokens":5,"top_p":0.9}}"#
        );
    }

    #[test]
    fn without_prompt_members_it_is_plain_canonical_json() {
        let body = json!({"b": [1.5, {"y": null, "x": "é"}], "a": true, "😀": 0, "\u{ff61}": 1});
        let mut canonical = Vec::new();
        write_canonical(&body, &mut canonical);
        assert_eq!(native_window(&body, &[], usize::MAX), canonical);
        assert_eq!(
            native_window(&body, &default_prompt_members(), usize::MAX),
            canonical
        );
    }

    #[test]
    fn non_objects_are_plain_canonical_json() {
        assert_eq!(
            window(&json!([{"b": 1, "a": 2}, 1.0, "x"]), usize::MAX),
            r#"[{"a":2,"b":1},1,"x"]"#
        );
        assert_eq!(window(&json!("prompt"), 3), "\"pr");
        assert_eq!(window(&json!(null), 100), "null");
        assert_eq!(window(&json!({}), 100), "{}");
    }

    #[test]
    fn truncated_to_max_bytes_even_inside_a_character() {
        let body = json!({"prompt": "é".repeat(10), "max_tokens": 5});
        let w = native_window(&body, &default_prompt_members(), 12);
        assert_eq!(w.len(), 12);
        assert_eq!(&w[..11], "{\"prompt\":\"".as_bytes());
        assert_eq!(w[11], 0xc3);
        assert!(native_window(&body, &default_prompt_members(), 0).is_empty());
    }

    #[test]
    fn parameters_outside_the_window_do_not_matter() {
        let prompt = "You are a helpful assistant. ".repeat(100);
        let a = json!({"inputs": prompt, "parameters": {"max_new_tokens": 10}});
        let b = json!({"parameters": {"max_new_tokens": 99, "temperature": 0.1}, "inputs": prompt});
        assert_eq!(window(&a, 1024), window(&b, 1024));
        assert_ne!(window(&a, 1_000_000), window(&b, 1_000_000));
    }
}
