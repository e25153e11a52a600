//! The prompt of a Responses API or embeddings request, in the shape the
//! windows and the tokenizer already read: a Responses body becomes chat
//! `messages` (as vLLM turns it into a conversation before its chat template:
//! `instructions` a system message, then `input` — a string is one user turn,
//! items become turns in order), an embeddings body a completions `prompt`.
//!
//! Only routing reads the result; the upstream gets the client's bytes.

use serde_json::{Map, Value, json};

/// A body of the wrong shape: the offending member and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub param: String,
    pub message: String,
}

fn shape(param: impl Into<String>, message: impl Into<String>) -> Shape {
    Shape {
        param: param.into(),
        message: message.into(),
    }
}

/// A Responses body as a chat body: `{"messages": [...], "tools": ...}`.
pub fn as_chat(body: &Value) -> Result<Value, Shape> {
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(shape("instructions", "`instructions` must be a string")),
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                messages.push(item_message(item, i)?);
            }
        }
        None => return Err(shape("input", "`input` is required")),
        Some(_) => {
            return Err(shape(
                "input",
                "`input` must be a string or an array of input items",
            ));
        }
    }
    if messages.is_empty() {
        return Err(shape("input", "`input` must contain at least one item"));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), tools.clone());
    }
    Ok(Value::Object(chat))
}

/// One input item as a chat message: messages keep their role and text parts;
/// tool calls, their outputs and other items keep their JSON (which the window
/// takes canonically), so two conversations split where their items differ.
fn item_message(item: &Value, i: usize) -> Result<Value, Shape> {
    let Value::Object(fields) = item else {
        return Err(shape(
            format!("input[{i}]"),
            "an input item must be an object",
        ));
    };
    let kind = fields.get("type").and_then(Value::as_str);
    if let Some(role) = fields.get("role") {
        let Value::String(role) = role else {
            return Err(shape(format!("input[{i}].role"), "`role` must be a string"));
        };
        let content = match fields.get("content") {
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => Value::Array(parts.iter().map(text_part).collect()),
            None | Some(Value::Null) => Value::Null,
            Some(_) => {
                return Err(shape(
                    format!("input[{i}].content"),
                    "`content` must be a string or an array of content parts",
                ));
            }
        };
        return Ok(json!({"role": role, "content": content}));
    }
    let role = match kind {
        Some("function_call_output") => "tool",
        Some(_) => "assistant",
        None => {
            return Err(shape(
                format!("input[{i}]"),
                "an input item needs a `role` or a `type`",
            ));
        }
    };
    Ok(json!({"role": role, "content": [item]}))
}

/// `input_text` and `output_text` parts read as chat's `text` parts.
fn text_part(part: &Value) -> Value {
    let kind = part.get("type").and_then(Value::as_str);
    match (kind, part.get("text")) {
        (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
            json!({"type": "text", "text": t})
        }
        _ => part.clone(),
    }
}

/// An embeddings body as a completions body: `input` as `prompt` (strings,
/// token ids, or batches of either). vLLM's chat-style embeddings (`messages`)
/// are windowed as chat by the caller.
pub fn embeddings_prompt(body: &Value) -> Result<Value, Shape> {
    match body.get("input") {
        Some(input @ (Value::String(_) | Value::Array(_))) => Ok(json!({"prompt": input})),
        None => Err(shape("input", "`input` is required")),
        Some(_) => Err(shape(
            "input",
            "`input` must be a string, an array of strings, an array of token ids, or an array of token-id arrays",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_then_input_as_turns() {
        let chat = as_chat(&json!({"instructions": "Be brief.", "input": "Hi"})).unwrap();
        assert_eq!(
            chat,
            json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})
        );
        let items = json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "42"},
        ], "tools": [{"type": "function", "name": "f"}]});
        let chat = as_chat(&items).unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m[0]["content"][0], json!({"type": "text", "text": "a"}));
        assert_eq!(m[0]["content"][1]["type"], "input_image");
        assert_eq!(m[1]["content"][0]["text"], "b");
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[3]["role"], "tool");
        assert_eq!(chat["tools"][0]["name"], "f");
        // The same conversation routes as the same chat would.
        let w = kvgate_prefix::chat_window(&chat, 1000).unwrap();
        assert!(w.starts_with("[{"), "{w}");
    }

    #[test]
    fn wrong_shapes_name_their_member() {
        assert_eq!(as_chat(&json!({})).unwrap_err().param, "input");
        assert_eq!(as_chat(&json!({"input": 3})).unwrap_err().param, "input");
        assert_eq!(as_chat(&json!({"input": []})).unwrap_err().param, "input");
        assert_eq!(
            as_chat(&json!({"input": [1]})).unwrap_err().param,
            "input[0]"
        );
        assert_eq!(
            as_chat(&json!({"input": "x", "instructions": 1}))
                .unwrap_err()
                .param,
            "instructions"
        );
        assert_eq!(
            as_chat(&json!({"input": [{"role": 1}]})).unwrap_err().param,
            "input[0].role"
        );
        assert_eq!(
            embeddings_prompt(&json!({"input": {}})).unwrap_err().param,
            "input"
        );
        assert_eq!(
            embeddings_prompt(&json!({"input": ["a", "b"]})).unwrap(),
            json!({"prompt": ["a", "b"]})
        );
    }
}
