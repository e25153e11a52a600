//! The window of an OpenAI chat completion body.
//!
//! Pieces are joined with ASCII control characters the client cannot forge, so
//! the window is an injective, prefix-preserving encoding of
//! (tools, [(role, content)…]) — two bodies share a window prefix only if they
//! share that much conversation:
//!
//! ```text
//! window  := [ tools GS ] ( role US content RS )*
//! content := ""                          string "" / null / absent / []
//!          | text                        string content
//!          | part ( FS part )*           array content
//! part    := text                        {"type":"text","text":…}
//!          | SUB canonical-json          any other part, RFC 8785 form
//! ```
//!
//! `GS` U+001D, `US` U+001F, `RS` U+001E, `FS` U+001C, `SUB` U+001A. In `role` and
//! `text`, each of U+001A..=U+001F is preceded by `ESC` (U+001B); canonical JSON
//! never holds a raw control character, so it needs no escaping. Separators and
//! escapes count as characters. Content given as a string and as one text part is
//! the same prompt to the model, so it gets the same window. Other message members
//! (`name`, `tool_calls`, …) are not part of the window.

use serde_json::Value;

use super::ShapeError;
use super::budget::{CharBudget, ESC};
use super::opening::{HistoryMark, Window};
use crate::canonical::write_until;

pub(super) const SUB: char = '\u{1a}';
pub(super) const FS: char = '\u{1c}';
pub(super) const GS: char = '\u{1d}';
pub(super) const RS: char = '\u{1e}';
pub(super) const US: char = '\u{1f}';

// The escape must sit in the reserved range the budget escapes.
const _: () = assert!(ESC as u32 == 0x1b && SUB as u32 == 0x1a && US as u32 == 0x1f);

/// The first `max_chars` characters (Unicode scalar values) of the body's
/// conversation, encoded as described in the module docs.
///
/// Validates the whole `messages` array whatever `max_chars` is, so whether a
/// body is refused never depends on the configured prefix length; text past the
/// window is never copied or canonicalised.
pub fn chat_window(body: &Value, max_chars: usize) -> Result<String, ShapeError> {
    chat_window_with_history(body, max_chars).map(|w| w.text)
}

/// [`chat_window`] and where its conversation's own part begins
/// ([`Window::history_from`]).
pub fn chat_window_with_history(body: &Value, max_chars: usize) -> Result<Window, ShapeError> {
    let messages = messages_of(body)?;
    let mut window = CharBudget::new(max_chars);
    let mut mark = HistoryMark::default();
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        if !window.is_full() {
            push_canonical(&mut window, tools);
        }
        window.push(GS);
    }
    for (i, message) in messages.iter().enumerate() {
        mark.before(message, &window, max_chars);
        push_message(&mut window, message, i)?;
    }
    Ok(mark.window(window))
}

/// A body's non-empty `messages` array (chat and Anthropic's Messages alike;
/// both APIs answer an empty conversation with a 400 too).
pub(super) fn messages_of(body: &Value) -> Result<&[Value], ShapeError> {
    match body.get("messages") {
        Some(Value::Array(m)) if m.is_empty() => Err(ShapeError::new(
            "messages",
            "must contain at least one message",
        )),
        Some(Value::Array(m)) => Ok(m),
        Some(_) => Err(ShapeError::new(
            "messages",
            "expected an array of message objects",
        )),
        None => Err(ShapeError::new("messages", "missing required parameter")),
    }
}

fn push_message(window: &mut CharBudget, message: &Value, i: usize) -> Result<(), ShapeError> {
    let Value::Object(message) = message else {
        return Err(ShapeError::new(
            format!("messages[{i}]"),
            "expected a message object",
        ));
    };
    let role = match message.get("role") {
        Some(Value::String(role)) => role,
        Some(_) => {
            return Err(ShapeError::new(
                format!("messages[{i}].role"),
                "expected a string",
            ));
        }
        None => {
            return Err(ShapeError::new(
                format!("messages[{i}].role"),
                "missing required parameter",
            ));
        }
    };
    window.push_escaped(role);
    window.push(US);
    match message.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => window.push_escaped(text),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                if j > 0 {
                    window.push(FS);
                }
                push_part(window, part, i, j)?;
            }
        }
        Some(_) => {
            return Err(ShapeError::new(
                format!("messages[{i}].content"),
                "expected a string, an array of content parts, or null",
            ));
        }
    }
    window.push(RS);
    Ok(())
}

fn push_part(window: &mut CharBudget, part: &Value, i: usize, j: usize) -> Result<(), ShapeError> {
    let Value::Object(fields) = part else {
        return Err(ShapeError::new(
            format!("messages[{i}].content[{j}]"),
            "expected a content part object",
        ));
    };
    if fields.get("type").and_then(Value::as_str) == Some("text") {
        match fields.get("text") {
            Some(Value::String(text)) => window.push_escaped(text),
            _ => {
                return Err(ShapeError::new(
                    format!("messages[{i}].content[{j}].text"),
                    "a text part needs a string 'text'",
                ));
            }
        }
    } else if !window.is_full() {
        window.push(SUB);
        push_canonical(window, part);
    }
    Ok(())
}

pub(super) fn push_canonical(window: &mut CharBudget, value: &Value) {
    let mut json = Vec::new();
    // n characters take at most 4n bytes: serialise no further than that.
    write_until(value, &mut json, window.remaining().saturating_mul(4));
    // Canonical output is always UTF-8; lossy conversion only avoids a panic path.
    window.push_raw(&String::from_utf8_lossy(&json));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window(body: Value) -> String {
        chat_window(&body, usize::MAX).unwrap()
    }

    fn err(body: Value) -> ShapeError {
        chat_window(&body, usize::MAX).unwrap_err()
    }

    #[test]
    fn roles_and_contents_in_order() {
        let w = window(json!({"model": "m", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ]}));
        assert_eq!(w, "system\u{1f}Be brief.\u{1e}user\u{1f}Hi\u{1e}");
    }

    #[test]
    fn tools_come_first_as_canonical_json() {
        let w = window(json!({
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"parameters": {}, "name": "f"}}],
        }));
        assert_eq!(
            w,
            "[{\"function\":{\"name\":\"f\",\"parameters\":{}},\"type\":\"function\"}]\u{1d}user\u{1f}x\u{1e}"
        );
        let one = json!([{"role": "user", "content": "x"}]);
        assert_eq!(
            window(json!({"tools": null, "messages": one})),
            window(json!({"messages": one}))
        );
        assert!(chat_window(&json!({"messages": []}), 100).is_err());
    }

    #[test]
    fn array_content_text_parts_and_non_text_parts() {
        let w = window(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
            {"type": "text", "text": "here"},
        ]}]}));
        assert_eq!(
            w,
            "user\u{1f}look\u{1c}\u{1a}{\"image_url\":{\"detail\":\"low\",\"url\":\"https://x/y.png\"},\
             \"type\":\"image_url\"}\u{1c}here\u{1e}"
        );
    }

    #[test]
    fn string_content_equals_a_single_text_part() {
        let a = window(json!({"messages": [{"role": "user", "content": "same"}]}));
        let b = window(
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "same"}]}]}),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn null_absent_and_empty_content_agree() {
        let expected = "assistant\u{1f}\u{1e}";
        for content in [json!(null), json!(""), json!([])] {
            assert_eq!(
                window(json!({"messages": [{"role": "assistant", "content": content}]})),
                expected
            );
        }
        assert_eq!(
            window(json!({"messages": [{"role": "assistant"}]})),
            expected
        );
    }

    #[test]
    fn client_text_cannot_forge_separators() {
        // Without escaping these two conversations would share one window.
        let one = window(json!({"messages": [{"role": "user", "content": "a\u{1e}user\u{1f}b"}]}));
        let two = window(json!({"messages": [
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
        ]}));
        assert_ne!(one, two);
        assert_eq!(one, "user\u{1f}a\u{1b}\u{1e}user\u{1b}\u{1f}b\u{1e}");
        // A text part spelling out an image part differs from the image part.
        let image = json!({"type": "image_url", "image_url": {"url": "u"}});
        let fake = json!({"type": "text", "text": format!("\u{1a}{}", serde_json::to_string(&image).unwrap())});
        assert_ne!(
            window(json!({"messages": [{"role": "user", "content": [image]}]})),
            window(json!({"messages": [{"role": "user", "content": [fake]}]}))
        );
        // Role boundary moves are visible.
        assert_ne!(
            window(json!({"messages": [{"role": "ab", "content": "c"}]})),
            window(json!({"messages": [{"role": "a", "content": "bc"}]}))
        );
    }

    #[test]
    fn window_is_a_char_prefix_of_the_full_window() {
        let body = json!({"tools": [{"t": "é"}], "messages": [
            {"role": "system", "content": "😀 long system prompt ".repeat(50)},
            {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "input_audio", "x": 1}]},
        ]});
        let full = chat_window(&body, usize::MAX).unwrap();
        let total = full.chars().count();
        for n in [0, 1, 7, 11, 12, 13, 500, total - 1, total, total + 5] {
            let w = chat_window(&body, n).unwrap();
            assert_eq!(w.chars().count(), n.min(total), "n = {n}");
            assert!(full.starts_with(&w), "n = {n}");
        }
    }

    #[test]
    fn later_turns_do_not_change_a_full_window() {
        let system = "S".repeat(10_000);
        let a = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "a"}]});
        let b = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "b"}], "max_tokens": 9});
        assert_eq!(
            chat_window(&a, 4096).unwrap(),
            chat_window(&b, 4096).unwrap()
        );
        assert_ne!(
            chat_window(&a, 20_000).unwrap(),
            chat_window(&b, 20_000).unwrap()
        );
    }

    #[test]
    fn shape_errors_name_the_param() {
        let cases = [
            (json!({}), "messages"),
            (json!([1]), "messages"),
            (json!({"messages": "hi"}), "messages"),
            (json!({"messages": {"role": "user"}}), "messages"),
            (json!({"messages": [1]}), "messages[0]"),
            (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "u"}, {"role": 5}]}),
                "messages[1].role",
            ),
            (
                json!({"messages": [{"role": "u"}, {"role": "u"}, {"role": "u", "content": 3}]}),
                "messages[2].content",
            ),
            (
                json!({"messages": [{"role": "u", "content": {"text": "x"}}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "u", "content": ["x"]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "u", "content": [{"type": "text"}]}]}),
                "messages[0].content[0].text",
            ),
            (
                json!({"messages": [{"role": "u", "content": [{"type": "text", "text": 1}]}]}),
                "messages[0].content[0].text",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(err(body.clone()).param, param, "{body}");
        }
    }

    #[test]
    fn validation_does_not_depend_on_max_chars() {
        let body =
            json!({"messages": [{"role": "system", "content": "x".repeat(100)}, {"role": 1}]});
        for n in [0, 10, 1_000] {
            assert_eq!(chat_window(&body, n).unwrap_err().param, "messages[1].role");
        }
    }
}
