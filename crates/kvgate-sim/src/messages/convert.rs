//! A Messages body → the chat completions body vLLM 0.32 turns it into
//! (`AnthropicServingMessages.to_chat_completion_request`), so the prompt the
//! cache sees is the chat path's: the top-level `system` (a string, or its text
//! blocks joined) as the first system message; each message in order, text
//! blocks as text (one alone as a plain string), images as `image_url` parts,
//! `thinking` as `reasoning`, `tool_use` as the assistant's `tool_calls`
//! (arguments as Python's `json.dumps`), a user's `tool_result` as a `tool`
//! message ahead of the rest of that user message; a user message left with no
//! content is dropped. Claude Code's `x-anthropic-billing-header` system
//! blocks are skipped, as vLLM skips them. With a tokenizer whose chat
//! template refuses a system message after the first turn, inline system
//! messages are merged into the leading one, as vLLM probes and does.
//!
//! Not rendered (they change sampling, not the prompt, in the sim):
//! `tool_choice`, `thinking`, `output_config`, `tool_addition`/`tool_removal`.

use kvgate_tokenize::PromptTokenizer;
use serde_json::{Map, Value, json};

use super::pyjson;
use super::validate::{self, Body};
use crate::error::ApiError;

const BILLING: &str = "x-anthropic-billing-header";

/// A converted request.
#[derive(Debug)]
pub(crate) struct Converted {
    /// The chat completions body, for [`crate::request::parse_chat`].
    pub chat: Value,
    /// The tool the answer calls: the first tool's name, when tools are given
    /// and the last message is not a user turn carrying a `tool_result`.
    pub tool: Option<String>,
}

/// `generate`: `POST /v1/messages` (which needs `max_tokens`), else `count_tokens`.
pub(crate) fn convert(
    body: &[u8],
    generate: bool,
    tok: Option<&PromptTokenizer>,
) -> Result<Converted, ApiError> {
    let value = validate::parse(body)?;
    let b = validate::check(&value, generate)?;
    let merge = tok.is_some_and(|t| has_inline_system(&b) && requires_system_first(t));
    let mut out: Vec<Value> = Vec::new();
    let mut system: Vec<String> = Vec::new();
    match b.system {
        Some(Value::String(s)) if !s.is_empty() => system.push(s.clone()),
        Some(Value::Array(blocks)) => system.extend(text_of_blocks(blocks)),
        _ => {}
    }
    if merge {
        let inline = b.messages.iter().filter(|m| m["role"] == "system");
        system.extend(inline.filter_map(|m| system_text(&m["content"])));
    }
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system.concat()}));
    }
    for m in b.messages {
        let role = m["role"].as_str().unwrap_or("user");
        if role == "system" {
            if let Some(text) = system_text(&m["content"]).filter(|_| !merge) {
                out.push(json!({"role": "system", "content": text}));
            }
            continue;
        }
        let mut msg = Map::new();
        msg.insert("role".into(), role.into());
        match &m["content"] {
            Value::String(s) => {
                msg.insert("content".into(), s.as_str().into());
            }
            Value::Array(blocks) => blocks_into(role, blocks, &mut msg, &mut out),
            _ => {}
        }
        if role != "user" || msg.contains_key("content") {
            out.push(Value::Object(msg));
        }
    }
    let mut chat = json!({"model": b.model, "messages": out, "stream": b.stream});
    if let Some(n) = b.max_tokens {
        chat["max_tokens"] = n.into();
    }
    if let Some(tools) = b.tools {
        chat["tools"] = tools.iter().map(tool).collect();
    }
    for key in ["cache_salt", "chat_template_kwargs"] {
        if let Some(v) = b.raw.get(key).filter(|v| !v.is_null()) {
            chat[key] = v.clone();
        }
    }
    let answered = b.messages.last().is_some_and(carries_tool_result);
    let tool = b
        .tools
        .and_then(|t| t.first())
        .and_then(|t| t["name"].as_str())
        .filter(|_| !answered)
        .map(str::to_owned);
    Ok(Converted { chat, tool })
}

/// Text blocks' texts (non-empty, billing headers skipped).
fn text_of_blocks(blocks: &[Value]) -> Vec<String> {
    blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .filter(|t| !t.is_empty() && !t.starts_with(BILLING))
        .map(str::to_owned)
        .collect()
}

/// An inline system message's text, `None` when it has none.
fn system_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) if s.starts_with(BILLING) => None,
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => Some(text_of_blocks(blocks).concat()),
        _ => None,
    }
    .filter(|t| !t.is_empty())
}

/// A message's blocks into `msg` (content parts, `tool_calls`, `reasoning`),
/// and a user's tool results into `out` ahead of it.
fn blocks_into(role: &str, blocks: &[Value], msg: &mut Map<String, Value>, out: &mut Vec<Value>) {
    let (mut parts, mut calls, mut reasoning) = (Vec::new(), Vec::new(), Vec::new());
    for b in blocks {
        match b["type"].as_str().unwrap_or("") {
            "text" => {
                if let Some(t) = b["text"].as_str().filter(|t| !t.is_empty()) {
                    parts.push(json!({"type": "text", "text": t}));
                }
            }
            "image" if truthy(&b["source"]) => parts.push(image(&b["source"])),
            "thinking" => reasoning.extend(b["thinking"].as_str()),
            "tool_use" => calls.push(json!({
                "id": b["id"].as_str().filter(|s| !s.is_empty()).unwrap_or("call_0"),
                "type": "function",
                "function": {
                    "name": b["name"].as_str().unwrap_or(""),
                    "arguments": arguments(&b["input"]),
                },
            })),
            "tool_result" if role == "user" => tool_result(b, out),
            "tool_result" => {
                let text = match &b["content"] {
                    Value::String(s) => s.clone(),
                    v if truthy(v) => v.to_string(),
                    _ => String::new(),
                };
                parts.push(json!({"type": "text", "text": format!("Tool result: {text}")}));
            }
            _ => {} // redacted_thinking, tool_reference, tool changes: nothing rendered
        }
    }
    if !reasoning.is_empty() {
        msg.insert("reasoning".into(), reasoning.concat().into());
    }
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), calls.into());
    }
    match parts.as_slice() {
        [] => {}
        [one] if one["type"] == "text" => {
            msg.insert("content".into(), one["text"].clone());
        }
        _ => {
            msg.insert("content".into(), parts.into());
        }
    }
}

/// A `tool_use` block's `input` as vLLM writes `arguments`: `json.dumps(input or {})`.
fn arguments(input: &Value) -> String {
    if truthy(input) {
        pyjson::dumps(input)
    } else {
        "{}".to_owned()
    }
}

/// A user's `tool_result`: a `tool` message (text items joined by "\n"),
/// then its images as a user message and its tool references as another
/// `tool` message.
fn tool_result(b: &Value, out: &mut Vec<Value>) {
    let id = b["tool_use_id"].as_str().unwrap_or("");
    let (mut texts, mut images, mut refs) = (Vec::new(), Vec::new(), Vec::new());
    let text = match &b["content"] {
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            for item in items {
                match item["type"].as_str() {
                    Some("text") => texts.push(item["text"].as_str().unwrap_or("")),
                    Some("image") => images.push(image(&item["source"])),
                    Some("tool_reference") => {
                        let name = [&item["tool_name"], &item["name"]]
                            .into_iter()
                            .find_map(|n| n.as_str().filter(|s| !s.is_empty()));
                        refs.extend(name.map(|n| json!({"type": "tool_reference", "name": n})));
                    }
                    _ => {}
                }
            }
            texts.join("\n")
        }
        _ => String::new(),
    };
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if !images.is_empty() {
        out.push(json!({"role": "user", "content": images}));
    }
    if !refs.is_empty() {
        out.push(json!({"role": "tool", "tool_call_id": id, "content": refs}));
    }
}

/// An image source as an `image_url` part: its URL, or a base64 data URL
/// (the data is never decoded).
fn image(source: &Value) -> Value {
    let url = if source["type"] == "url" {
        source["url"].as_str().unwrap_or("").to_owned()
    } else {
        let media = source["media_type"].as_str().unwrap_or("image/jpeg");
        format!(
            "data:{media};base64,{}",
            source["data"].as_str().unwrap_or("")
        )
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// An Anthropic tool as the chat `tools` entry vLLM builds (`input_schema` as
/// `parameters`, `"type": "object"` added when it has none).
fn tool(t: &Value) -> Value {
    let mut params = t["input_schema"].clone();
    if let Some(obj) = params.as_object_mut() {
        obj.entry("type").or_insert_with(|| "object".into());
    }
    let mut function = json!({"name": t["name"], "parameters": params});
    if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
        function["description"] = d.clone();
    }
    json!({"type": "function", "function": function})
}

/// Python's truth value of a JSON value (what vLLM's `if block.source:` tests).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// A user message with a `tool_result` block: the answer to a tool call.
fn carries_tool_result(m: &Value) -> bool {
    m["role"] == "user"
        && m["content"]
            .as_array()
            .is_some_and(|bs| bs.iter().any(|b| b["type"] == "tool_result"))
}

fn has_inline_system(b: &Body<'_>) -> bool {
    b.messages.iter().any(|m| m["role"] == "system")
}

/// vLLM's `_detect_merge_inline_system`: the template fails on a system
/// message after a user turn (with or without tools).
fn requires_system_first(tok: &PromptTokenizer) -> bool {
    let probe = json!([
        {"role": "system", "content": "t"}, {"role": "user", "content": "t"},
        {"role": "system", "content": "t"}, {"role": "user", "content": "t"},
    ]);
    let plain = json!({"messages": probe, "add_generation_prompt": false});
    let tools = json!({"messages": probe, "tools": [], "add_generation_prompt": false});
    tok.render_chat(&plain).is_err() || tok.render_chat(&tools).is_err()
}
