//! A Messages body → the OpenAI chat body vLLM renders for it, so `kv_aware`
//! tokenizes an agent's prompt with the model's chat template exactly as the
//! engine does and looks up the blocks the engine's KV events name.
//!
//! Mirrors vLLM 0.32's `AnthropicServingMessages.to_chat_completion_request`
//! (vllm/entrypoints/anthropic/serving.py), in its order:
//! - `system` (a string, or its non-empty text blocks joined with "") becomes
//!   the first message; blocks starting `x-anthropic-billing-header` (Claude
//!   Code's per-request hash) are dropped. When the template refuses a system
//!   message after the first turn, inline `system` messages are merged into it.
//! - a message's text blocks become text parts (one alone: a string),
//!   `thinking` its `reasoning`, `tool_use` its `tool_calls` (arguments as a
//!   JSON string), a user's `tool_result` a `tool` message placed before it
//!   (text items joined with "\n"); a user message left without content is
//!   dropped.
//! - `tools` become functions (`input_schema` as `parameters`).
//!
//! What is not mirrored, because it is time-dependent or Python's own: a
//! `tool_use` without an id (vLLM names it by the clock), an assistant's
//! `tool_result` with block content (Python's `str()` of a list), and
//! `tool_addition`/`tool_removal` blocks; these make the conversion give up,
//! and the request is routed by the approximate index, never refused. Nor
//! `thinking.type: disabled` and `output_config.effort`, which vLLM hands to
//! the template as `reasoning_effort` (templates that read it render
//! differently). JSON objects (tool schemas, tool inputs) reach the template
//! with their keys sorted, where vLLM keeps the client's order: exact for
//! templates that do not print them (SmolLM2's), not for those that do.

use serde_json::{Map, Value, json};

const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The chat body, or `None` when the conversation holds what is not mirrored
/// (the caller routes by the approximate index instead).
pub fn as_chat(body: &Value, merge_inline_system: bool) -> Option<Value> {
    let messages = body.get("messages")?.as_array()?;
    if messages.iter().any(changes_tools) {
        return None;
    }
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut system = Vec::new();
    match body.get("system") {
        Some(Value::String(s)) if !s.is_empty() => system.push(s.clone()),
        Some(Value::Array(blocks)) => system.extend(system_texts(blocks)),
        _ => {}
    }
    if merge_inline_system {
        for m in messages.iter().filter(|m| role(m) == Some("system")) {
            system.extend(inline_system(m));
        }
    }
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system.concat()}));
    }
    for m in messages {
        match role(m)? {
            "system" if merge_inline_system => {}
            "system" => {
                if let Some(text) = inline_system(m).filter(|t| !t.is_empty()) {
                    out.push(json!({"role": "system", "content": text}));
                }
            }
            r => convert_message(r, m.get("content")?, &mut out)?,
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(out));
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), convert_tools(tools.as_array()?)?);
    }
    if let Some(kwargs) = body.get("chat_template_kwargs") {
        chat.insert("chat_template_kwargs".into(), kwargs.clone());
    }
    Some(Value::Object(chat))
}

/// A message with `tool_addition`/`tool_removal` blocks (vLLM resolves them
/// into the tool list; not mirrored).
fn changes_tools(m: &Value) -> bool {
    m.get("content")
        .and_then(Value::as_array)
        .is_some_and(|blocks| {
            blocks.iter().any(|b| {
                matches!(
                    b.get("type").and_then(Value::as_str),
                    Some("tool_addition" | "tool_removal")
                )
            })
        })
}

fn role(m: &Value) -> Option<&str> {
    m.get("role")?.as_str()
}

fn text_of(block: &Value) -> Option<&str> {
    (block.get("type")?.as_str()? == "text")
        .then(|| block.get("text")?.as_str())
        .flatten()
        .filter(|t| !t.is_empty())
}

fn system_texts(blocks: &[Value]) -> impl Iterator<Item = String> + '_ {
    blocks
        .iter()
        .filter_map(text_of)
        .filter(|t| !t.starts_with(BILLING_HEADER))
        .map(str::to_owned)
}

/// vLLM's `_extract_system_text`.
fn inline_system(m: &Value) -> Option<String> {
    match m.get("content")? {
        Value::String(s) if s.starts_with(BILLING_HEADER) => None,
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => {
            let parts: Vec<String> = system_texts(blocks).collect();
            (!parts.is_empty()).then(|| parts.concat())
        }
        _ => None,
    }
}

fn convert_message(role: &str, content: &Value, out: &mut Vec<Value>) -> Option<()> {
    let mut msg = Map::new();
    msg.insert("role".into(), json!(role));
    let blocks = match content {
        Value::String(s) => {
            msg.insert("content".into(), json!(s));
            out.push(Value::Object(msg));
            return Some(());
        }
        Value::Array(blocks) => blocks,
        _ => return None,
    };
    let (mut parts, mut calls) = (Vec::new(), Vec::new());
    // Present once a thinking block is, even an empty one (vLLM's test).
    let mut reasoning: Option<String> = None;
    for block in blocks {
        match block.get("type")?.as_str()? {
            "text" => parts.extend(text_of(block).map(|t| json!({"type": "text", "text": t}))),
            "thinking" => {
                if let Some(t) = block.get("thinking").and_then(Value::as_str) {
                    reasoning.get_or_insert_default().push_str(t);
                }
            }
            "tool_use" => calls.push(json!({
                "id": block.get("id").and_then(Value::as_str).filter(|s| !s.is_empty())?,
                "type": "function",
                "function": {
                    "name": block.get("name").and_then(Value::as_str).unwrap_or(""),
                    "arguments": serde_json::to_string(block.get("input").filter(|v| !v.is_null()).unwrap_or(&json!({}))).ok()?,
                },
            })),
            "tool_result" if role == "user" => out.extend(tool_messages(block)?),
            "tool_result" => match block.get("content") {
                None | Some(Value::Null) => {
                    parts.push(json!({"type": "text", "text": "Tool result: "}))
                }
                Some(Value::String(s)) => {
                    let text = format!("Tool result: {s}");
                    parts.push(json!({"type": "text", "text": text}));
                }
                Some(_) => return None,
            },
            // Images reach no text-only template; the rest vLLM skips too.
            _ => {}
        }
    }
    if let Some(r) = reasoning {
        msg.insert("reasoning".into(), json!(r));
    }
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    match parts.len() {
        0 => {}
        1 => {
            msg.insert("content".into(), parts[0]["text"].clone());
        }
        _ => {
            msg.insert("content".into(), Value::Array(parts));
        }
    }
    // A user turn that was only tool results has become `tool` messages.
    if role != "user" || msg.contains_key("content") {
        out.push(Value::Object(msg));
    }
    Some(())
}

/// A user's `tool_result` as the messages vLLM makes of it: a `tool`
/// message of its text items, then a `user` message of its images, then a
/// `tool` message of its `tool_reference` items.
fn tool_messages(block: &Value) -> Option<Vec<Value>> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (mut texts, mut images, mut references) = (Vec::new(), Vec::new(), Vec::new());
    match block.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => texts.push(s.as_str()),
        Some(Value::Array(items)) => {
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(item.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some("image") => images.push(json!({"type": "image_url", "image_url": {"url": image_url(item.get("source"))}})),
                    Some("tool_reference") => {
                        let name = item.get("tool_name").or_else(|| item.get("name")).and_then(Value::as_str);
                        references.extend(name.filter(|n| !n.is_empty()).map(|n| json!({"type": "tool_reference", "name": n})));
                    }
                    _ => {}
                }
            }
        }
        Some(_) => return None,
    }
    let mut out = vec![json!({"role": "tool", "tool_call_id": id, "content": texts.join("\n")})];
    if !images.is_empty() {
        out.push(json!({"role": "user", "content": images}));
    }
    if !references.is_empty() {
        out.push(json!({"role": "tool", "tool_call_id": id, "content": references}));
    }
    Some(out)
}

/// vLLM's `_convert_image_source_to_url`.
fn image_url(source: Option<&Value>) -> String {
    let get = |k: &str| source.and_then(|s| s.get(k)).and_then(Value::as_str);
    match get("type") {
        Some("url") => get("url").unwrap_or("").to_owned(),
        _ => format!(
            "data:{};base64,{}",
            get("media_type").unwrap_or("image/jpeg"),
            get("data").unwrap_or("")
        ),
    }
}

fn convert_tools(tools: &[Value]) -> Option<Value> {
    let mut out = Vec::with_capacity(tools.len());
    for tool in tools {
        let mut function = Map::new();
        function.insert("name".into(), tool.get("name")?.clone());
        function.insert(
            "description".into(),
            tool.get("description").cloned().unwrap_or(Value::Null),
        );
        function.insert("parameters".into(), tool.get("input_schema")?.clone());
        for optional in ["strict", "defer_loading"] {
            if let Some(v) = tool.get(optional).filter(|v| !v.is_null()) {
                function.insert(optional.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Some(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_turn_becomes_vllms_chat() {
        let body = json!({
            "system": [{"type": "text", "text": "x-anthropic-billing-header: abc"}, {"type": "text", "text": "You code."}, {"type": "text", "text": " Carefully."}],
            "tools": [{"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "Fix the bug"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look first", "signature": "s"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.rs"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "fn a()"}, {"type": "text", "text": "fn b()"}]},
                ]},
                {"role": "system", "content": "reminder"},
            ],
        });
        let chat = as_chat(&body, false).unwrap();
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "You code. Carefully."},
                {"role": "user", "content": "Fix the bug"},
                {"role": "assistant", "content": "Reading.", "reasoning": "look first", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a.rs\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "fn a()\nfn b()"},
                {"role": "system", "content": "reminder"},
            ])
        );
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "read", "description": "Read a file", "parameters": {"type": "object"}}}])
        );
        let merged = as_chat(&body, true).unwrap();
        assert_eq!(
            merged["messages"][0]["content"],
            "You code. Carefully.reminder"
        );
        assert_eq!(merged["messages"].as_array().map(Vec::len), Some(4));
    }

    #[test]
    fn a_tool_results_images_and_references_become_messages_of_their_own() {
        let body = json!({"messages": [
            {"role": "assistant", "content": [{"type": "thinking", "thinking": ""}, {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "done"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
                {"type": "tool_reference", "tool_name": "grep"},
            ]}]},
        ]});
        let chat = as_chat(&body, false).unwrap();
        assert_eq!(
            chat["messages"][0]["reasoning"], "",
            "an empty thinking block is present"
        );
        assert_eq!(
            chat["messages"].as_array().unwrap()[1..],
            [
                json!({"role": "tool", "tool_call_id": "t", "content": "done"}),
                json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]}),
                json!({"role": "tool", "tool_call_id": "t", "content": [{"type": "tool_reference", "name": "grep"}]}),
            ]
        );
    }

    #[test]
    fn what_is_not_mirrored_is_none() {
        let tool_change = json!({"messages": [{"role": "system", "content": [{"type": "tool_addition", "tool": {}}]}, {"role": "user", "content": "x"}]});
        assert_eq!(as_chat(&tool_change, false).map(|_| ()), None);
        let no_id = json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]});
        assert_eq!(as_chat(&no_id, false).map(|_| ()), None);
    }
}
