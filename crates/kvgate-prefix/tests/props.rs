//! Property tests: the canonical form is a fixed point, agrees with the
//! reference implementation, ignores how a body is spelled; nothing panics on
//! any input; windows respect their limits and are prefixes of the full window.

use kvgate_prefix::{
    chat_window, completions_window, default_prompt_members, native_window, parse_strict,
    write_canonical,
};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Strings heavy in what canonicalisation and windows treat specially: escapes,
/// controls, the chat separators, non-ASCII, and the U+E000..U+FFFF / astral
/// pair whose UTF-8 and UTF-16 orders disagree.
fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c\"\\\\/\u{0}-\u{1f}\u{7f}é€\u{e000}\u{ff61}\u{ffff}😀\u{10ffff}]{0,8}",
        any::<String>(),
    ]
}

fn number() -> impl Strategy<Value = Number> {
    prop_oneof![
        any::<i64>().prop_map(Number::from),
        any::<u64>().prop_map(Number::from),
        any::<f64>().prop_filter_map("finite", Number::from_f64),
        (-1000i32..1000, -30i32..30).prop_filter_map("finite", |(m, e)| {
            Number::from_f64(f64::from(m) * 10f64.powi(e))
        }),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number().prop_map(Value::Number),
        tricky_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 96, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(tricky_string(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn canonical(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(v, &mut out);
    out
}

/// A deterministic stream of choices, so one proptest seed gives one spelling.
struct Choices(u64);

impl Choices {
    fn next(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// Writes `v` as JSON with shuffled members, random whitespace, random escapes
/// and random number spellings — everything canonicalisation must undo.
fn spell(v: &Value, c: &mut Choices, out: &mut String) {
    let ws = |c: &mut Choices, out: &mut String| {
        for _ in 0..c.next(3) {
            out.push([' ', '\t', '\n', '\r'][c.next(4) as usize]);
        }
    };
    ws(c, out);
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (c.next(3), n.as_f64()) {
            (1, Some(f)) => out.push_str(&format!("{f:e}")),
            (2, Some(f)) => out.push_str(&format!("{f:E}")),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => spell_str(s, c, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                spell(item, c, out);
            }
            ws(c, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            for i in (1..members.len()).rev() {
                members.swap(i, c.next(i as u64 + 1) as usize);
            }
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(c, out);
                spell_str(k, c, out);
                ws(c, out);
                out.push(':');
                spell(v, c, out);
            }
            ws(c, out);
            out.push('}');
        }
    }
    ws(c, out);
}

fn spell_str(s: &str, c: &mut Choices, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        let must = ch < ' ' || ch == '"' || ch == '\\';
        if must || c.next(4) == 0 {
            if ch == '/' && c.next(2) == 0 {
                out.push_str("\\/");
                continue;
            }
            let mut units = [0u16; 2];
            for u in ch.encode_utf16(&mut units) {
                if c.next(2) == 0 {
                    out.push_str(&format!("\\u{u:04x}"));
                } else {
                    out.push_str(&format!("\\u{u:04X}"));
                }
            }
        } else {
            out.push(ch);
        }
    }
    out.push('"');
}

fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn canonical_is_a_fixed_point(v in value()) {
        let once = canonical(&v);
        let reparsed = parse_strict(&once).unwrap();
        prop_assert_eq!(canonical(&reparsed), once);
    }

    #[test]
    fn canonical_agrees_with_the_reference_implementation(v in value()) {
        let reference = serde_json_canonicalizer::to_vec(&v).unwrap();
        let ours = canonical(&v);
        prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&reference));
    }

    #[test]
    fn canonical_ignores_member_order_whitespace_escapes_and_number_spelling(v in value(), seed in 1u64..) {
        let mut text = String::new();
        spell(&v, &mut Choices(seed), &mut text);
        let reparsed = parse_strict(text.as_bytes()).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(canonical(&reparsed), canonical(&v));
        let members = default_prompt_members();
        prop_assert_eq!(native_window(&reparsed, &members, 64), native_window(&v, &members, 64));
    }

    #[test]
    fn parse_strict_never_panics_on_bytes(bytes in any_bytes()) {
        let _ = parse_strict(&bytes);
    }

    #[test]
    fn parse_strict_never_panics_on_damaged_json(v in value(), edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
        let mut bytes = canonical(&v);
        bytes.push(b' ');
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if let Ok(parsed) = parse_strict(&bytes) {
            // Whatever still parses canonicalises to a fixed point too.
            let once = canonical(&parsed);
            prop_assert_eq!(canonical(&parse_strict(&once).unwrap()), once);
        }
    }

    #[test]
    fn chat_window_total_bounded_and_prefix_on_any_value(v in value(), max in 0usize..200) {
        if let Ok(w) = chat_window(&v, max) {
            prop_assert!(w.chars().count() <= max);
            let full = chat_window(&v, usize::MAX).unwrap();
            prop_assert!(full.starts_with(&w));
        }
    }

    #[test]
    fn chat_window_bounded_and_prefix_on_chat_shaped_bodies(
        messages in prop::collection::vec(
            (tricky_string(), prop_oneof![
                Just(Value::Null),
                tricky_string().prop_map(Value::String),
                prop::collection::vec(prop_oneof![
                    tricky_string().prop_map(|t| serde_json::json!({"type": "text", "text": t})),
                    value().prop_map(|v| serde_json::json!({"type": "image_url", "image_url": v})),
                ], 0..4).prop_map(Value::Array),
            ]),
            1..5,
        ),
        tools in prop::option::of(value()),
        max in 0usize..400,
    ) {
        let mut body = serde_json::json!({
            "messages": messages.into_iter()
                .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
                .collect::<Vec<_>>(),
        });
        if let Some(tools) = tools {
            body["tools"] = tools;
        }
        let full = chat_window(&body, usize::MAX).unwrap();
        let w = chat_window(&body, max).unwrap();
        prop_assert_eq!(w.chars().count(), max.min(full.chars().count()));
        prop_assert!(full.starts_with(&w));
    }

    #[test]
    fn completions_window_total_bounded_and_prefix(v in value(), max in 0usize..200) {
        let body = serde_json::json!({"prompt": v});
        for body in [&body, &v] {
            if let Ok(w) = completions_window(body, max) {
                prop_assert!(w.chars().count() <= max);
                prop_assert!(completions_window(body, usize::MAX).unwrap().starts_with(&w));
            }
        }
    }

    #[test]
    fn native_window_is_a_bounded_prefix_of_the_full_window(v in value(), max in 0usize..300) {
        let members = default_prompt_members();
        let full = native_window(&v, &members, usize::MAX);
        let w = native_window(&v, &members, max);
        prop_assert_eq!(w.len(), max.min(full.len()));
        prop_assert!(full.starts_with(&w));
        // With no members hoisted it is the canonical form itself.
        prop_assert_eq!(native_window(&v, &[], usize::MAX), canonical(&v));
    }
}
