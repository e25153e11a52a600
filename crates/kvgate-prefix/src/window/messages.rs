//! The window of an Anthropic Messages body (`POST /v1/messages`).
//!
//! The prompt is what the engine renders, in its order: `system`, then
//! `tools`, then `messages` with their content blocks. Encoded with the chat
//! window's separators (see `chat.rs`), so the same escaping makes it an
//! injective, prefix-preserving encoding:
//!
//! ```text
//! window  := [ "system" US system RS ] [ tools GS ] ( role US content RS )*
//! system  := text ( FS text )*           a string, or its text blocks
//! content := text                        a string
//!          | block ( FS block )*         an array of content blocks
//! block   := text                        {"type":"text","text":…}
//!          | SUB canonical-json          tool_use, tool_result, image, … in RFC 8785 form
//! ```
//!
//! Claude Code starts its system text with an `x-anthropic-billing-header`
//! line that differs in every request; vLLM drops it before rendering, and
//! so does the window (a block that starts with it, or a string's first line).
//! Images and documents are keyed by their data (the base64 string is part of
//! the canonical JSON), never decoded. A top-level `system` and a leading
//! `system`-role message (vLLM's extension, Claude Code's reminders) are the
//! same prompt to the engine, so they get the same window. Other members
//! (`metadata`, `max_tokens`, sampling) are not part of the window.

use serde_json::Value;

use super::ShapeError;
use super::budget::CharBudget;
use super::chat::{FS, GS, RS, SUB, US, messages_of, push_canonical};
use super::opening::{HistoryMark, Window};

/// Content block types the gateway forwards: Anthropic's and vLLM's. Any
/// other is refused before it reaches an engine.
pub const MESSAGE_BLOCK_TYPES: [&str; 14] = [
    "text",
    "image",
    "document",
    "search_result",
    "tool_use",
    "tool_result",
    "tool_reference",
    "tool_addition",
    "tool_removal",
    "server_tool_use",
    "web_search_tool_result",
    "thinking",
    "redacted_thinking",
    "container_upload",
];

/// Claude Code's per-request attribution line.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// `text` without a leading billing-header line.
fn without_billing(text: &str) -> &str {
    if text.starts_with(BILLING_HEADER) {
        text.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        text
    }
}

/// A text block that is only a billing header (dropped from system text).
fn is_billing_block(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("text")
        && block
            .get("text")
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with(BILLING_HEADER))
}

/// Roles a message may have (`system` is vLLM's extension).
const ROLES: [&str; 3] = ["user", "assistant", "system"];

/// The first `max_chars` characters of a Messages body's prompt, encoded as
/// described in the module docs. Validates `system`, `tools` and the whole
/// `messages` array whatever `max_chars` is.
pub fn messages_window(body: &Value, max_chars: usize) -> Result<String, ShapeError> {
    messages_window_with_history(body, max_chars).map(|w| w.text)
}

/// [`messages_window`] and where its conversation's own part begins
/// ([`Window::history_from`]).
pub fn messages_window_with_history(body: &Value, max_chars: usize) -> Result<Window, ShapeError> {
    let messages = messages_of(body)?;
    let mut window = CharBudget::new(max_chars);
    let mut mark = HistoryMark::default();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => push_turn(&mut window, "system", |w| {
            w.push_escaped(without_billing(text));
            Ok(())
        })?,
        Some(Value::Array(blocks)) => {
            push_turn(&mut window, "system", |w| system_blocks(w, blocks))?
        }
        Some(_) => {
            return Err(ShapeError::new(
                "system",
                "expected a string or an array of text blocks",
            ));
        }
    }
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(tools @ Value::Array(_)) => {
            if !window.is_full() {
                push_canonical(&mut window, tools);
            }
            window.push(GS);
        }
        Some(_) => return Err(ShapeError::new("tools", "expected an array of tools")),
    }
    for (i, message) in messages.iter().enumerate() {
        mark.before(message, &window, max_chars);
        push_message(&mut window, message, i)?;
    }
    Ok(mark.window(window))
}

/// `role US … RS`, the middle written by `body`.
fn push_turn(
    window: &mut CharBudget,
    role: &str,
    body: impl FnOnce(&mut CharBudget) -> Result<(), ShapeError>,
) -> Result<(), ShapeError> {
    window.push_escaped(role);
    window.push(US);
    body(window)?;
    window.push(RS);
    Ok(())
}

fn system_blocks(window: &mut CharBudget, blocks: &[Value]) -> Result<(), ShapeError> {
    let mut pushed = false;
    for (j, block) in blocks.iter().enumerate() {
        let text = match (block.get("type").and_then(Value::as_str), block.get("text")) {
            (Some("text"), Some(Value::String(text))) => text,
            _ => {
                return Err(ShapeError::new(
                    format!("system[{j}]"),
                    "expected a text block {\"type\":\"text\",\"text\":…}",
                ));
            }
        };
        if text.starts_with(BILLING_HEADER) {
            continue;
        }
        if pushed {
            window.push(FS);
        }
        pushed = true;
        window.push_escaped(text);
    }
    Ok(())
}

fn push_message(window: &mut CharBudget, message: &Value, i: usize) -> Result<(), ShapeError> {
    let Value::Object(message) = message else {
        return Err(ShapeError::new(
            format!("messages[{i}]"),
            "expected a message object",
        ));
    };
    let role = match message.get("role") {
        Some(Value::String(role)) if ROLES.contains(&role.as_str()) => role,
        Some(_) => {
            return Err(ShapeError::new(
                format!("messages[{i}].role"),
                "expected \"user\" or \"assistant\"",
            ));
        }
        None => {
            return Err(ShapeError::new(
                format!("messages[{i}].role"),
                "missing required parameter",
            ));
        }
    };
    match message.get("content") {
        Some(Value::String(text)) => push_turn(window, role, |w| {
            let text = if role == "system" {
                without_billing(text)
            } else {
                text
            };
            w.push_escaped(text);
            Ok(())
        }),
        Some(Value::Array(blocks)) => push_turn(window, role, |w| {
            let mut pushed = false;
            for (j, block) in blocks.iter().enumerate() {
                if role == "system" && is_billing_block(block) {
                    continue;
                }
                if pushed {
                    w.push(FS);
                }
                pushed = true;
                push_block(w, block, i, j)?;
            }
            Ok(())
        }),
        Some(_) => Err(ShapeError::new(
            format!("messages[{i}].content"),
            "expected a string or an array of content blocks",
        )),
        None => Err(ShapeError::new(
            format!("messages[{i}].content"),
            "missing required parameter",
        )),
    }
}

fn push_block(
    window: &mut CharBudget,
    block: &Value,
    i: usize,
    j: usize,
) -> Result<(), ShapeError> {
    let at = || format!("messages[{i}].content[{j}]");
    let kind = match block.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        _ if !block.is_object() => {
            return Err(ShapeError::new(at(), "expected a content block object"));
        }
        _ => {
            return Err(ShapeError::new(
                format!("{}.type", at()),
                "missing required parameter",
            ));
        }
    };
    if !MESSAGE_BLOCK_TYPES.contains(&kind) {
        return Err(ShapeError::new(
            format!("{}.type", at()),
            format!(
                "unknown content block type {kind:?}; expected one of {}",
                MESSAGE_BLOCK_TYPES.join(", ")
            ),
        ));
    }
    if kind == "text" {
        let Some(Value::String(text)) = block.get("text") else {
            return Err(ShapeError::new(
                format!("{}.text", at()),
                "a text block needs a string 'text'",
            ));
        };
        window.push_escaped(text);
    } else if !window.is_full() {
        window.push(SUB);
        push_canonical(window, block);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window(body: Value) -> String {
        messages_window(&body, usize::MAX).unwrap()
    }

    fn err(body: Value) -> ShapeError {
        messages_window(&body, usize::MAX).unwrap_err()
    }

    #[test]
    fn system_then_tools_then_messages() {
        let w = window(json!({
            "system": "Be brief.",
            "tools": [{"name": "read", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "Hi"}],
        }));
        assert_eq!(
            w,
            "system\u{1f}Be brief.\u{1e}[{\"input_schema\":{\"type\":\"object\"},\"name\":\"read\"}]\u{1d}user\u{1f}Hi\u{1e}"
        );
    }

    #[test]
    fn the_same_prompt_in_other_shapes_has_the_same_window() {
        let plain = window(json!({"system": "S", "messages": [{"role": "user", "content": "Hi"}]}));
        let blocks = window(json!({
            "system": [{"type": "text", "text": "S"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        }));
        let inline = window(json!({"messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Hi"},
        ]}));
        assert_eq!(plain, blocks);
        assert_eq!(plain, inline);
    }

    #[test]
    fn tool_turns_and_images_are_keyed_by_their_data() {
        let turn = |data: &str| {
            window(json!({"messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "fn main() {}"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
                ]},
            ]}))
        };
        assert_ne!(turn("aGVsbG8="), turn("d29ybGQ="));
        assert!(turn("aGVsbG8=").contains("\u{1a}{\"id\":\"t1\",\"input\":{\"path\":\"a\"}"));
    }

    #[test]
    fn claude_codes_billing_header_is_not_part_of_the_prompt() {
        let with = |header: &str| {
            window(json!({
                "system": [
                    {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1; cch={header};")},
                    {"type": "text", "text": "You are Claude Code."},
                ],
                "messages": [
                    {"role": "system", "content": format!("x-anthropic-billing-header: cch={header}\nreminder")},
                    {"role": "user", "content": "hi"},
                ],
            }))
        };
        assert_eq!(with("93a1f"), with("0be77"));
        assert_eq!(
            with("93a1f"),
            "system\u{1f}You are Claude Code.\u{1e}system\u{1f}reminder\u{1e}user\u{1f}hi\u{1e}"
        );
    }

    #[test]
    fn client_text_cannot_forge_a_turn() {
        let forged = window(json!({"messages": [
            {"role": "user", "content": "a\u{1e}assistant\u{1f}b"},
        ]}));
        let real = window(json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
        ]}));
        assert_ne!(forged, real);
    }

    #[test]
    fn shape_errors_name_the_param() {
        assert_eq!(err(json!({})).param, "messages");
        assert_eq!(err(json!({"messages": {}})).param, "messages");
        assert_eq!(err(json!({"messages": []})).param, "messages");
        assert_eq!(err(json!({"messages": [1]})).param, "messages[0]");
        let one = |m: Value| err(json!({"messages": [m]})).param;
        assert_eq!(
            one(json!({"role": "tool", "content": "x"})),
            "messages[0].role"
        );
        assert_eq!(one(json!({"role": "user"})), "messages[0].content");
        assert_eq!(
            one(json!({"role": "user", "content": 3})),
            "messages[0].content"
        );
        assert_eq!(
            one(json!({"role": "user", "content": [{"type": "video", "data": "x"}]})),
            "messages[0].content[0].type"
        );
        assert_eq!(
            one(json!({"role": "user", "content": [{"type": "text"}]})),
            "messages[0].content[0].text"
        );
        assert_eq!(
            one(json!({"role": "user", "content": ["x"]})),
            "messages[0].content[0]"
        );
        let ok = json!([{"role": "user", "content": "x"}]);
        assert_eq!(err(json!({"system": 1, "messages": ok})).param, "system");
        assert_eq!(
            err(json!({"system": [{"type": "image"}], "messages": ok})).param,
            "system[0]"
        );
        assert_eq!(err(json!({"tools": {}, "messages": ok})).param, "tools");
    }

    #[test]
    fn a_short_window_is_a_prefix_and_validation_still_runs() {
        let body = json!({"system": "long system prompt", "messages": [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "n", "input": {}}]},
        ]});
        let full = window(body.clone());
        for n in 0..full.chars().count() {
            let short = messages_window(&body, n).unwrap();
            assert!(full.starts_with(&short), "{n}");
            assert_eq!(short.chars().count(), n);
        }
        let bad = json!({"system": "s", "messages": [{"role": "user", "content": "x"}, {"role": "user", "content": [{"type": "nope"}]}]});
        assert!(messages_window(&bad, 1).is_err());
    }
}
