//! OpenAI chat messages → the conversation vLLM hands to a chat template.
//!
//! vLLM (`vllm/entrypoints/chat_utils.py`, "string" content format) keeps
//! `role`, turns `content` into one string (a string as is; an array of parts
//! to its text parts joined with "\n"; null or absent to ""), copies `name`,
//! `tool_calls`, `tool_call_id` and reasoning fields, and parses each tool
//! call's `function.arguments` from a JSON string into an object, because HF
//! templates expect a mapping there. Since vLLM 0.32 it also drops Claude
//! Code's per-request `x-anthropic-billing-header` line from system text
//! (`_strip_claude_code_billing_header`), and gives an assistant's
//! `reasoning` to the template as `reasoning_content` too.

use minijinja::Value;
use serde_json::Value as Json;

use crate::TokenizeError;

/// Part types whose `text` is prompt text; others (images, audio, files) are skipped.
const TEXT_PARTS: [&str; 3] = ["text", "input_text", "output_text"];

/// Fields copied from a message to the template as they are.
const PASSED: [&str; 4] = ["name", "tool_call_id", "reasoning_content", "reasoning"];

/// The first line of Claude Code's system text, different in every request.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// A system text without its billing-header line (`None`: nothing left).
fn strip_billing(text: &str) -> Option<&str> {
    if !text.starts_with(BILLING_HEADER) {
        return Some(text);
    }
    text.split_once('\n')
        .map(|(_, rest)| rest)
        .filter(|r| !r.is_empty())
}

/// A system message's content with billing-header lines dropped.
fn without_billing(content: Option<&Json>) -> Option<Json> {
    match content? {
        Json::String(s) => Some(Json::Array(
            strip_billing(s)
                .map(|t| serde_json::json!({"type": "text", "text": t}))
                .into_iter()
                .collect(),
        )),
        Json::Array(parts) => Some(Json::Array(
            parts
                .iter()
                .filter_map(|p| match p.get("text").and_then(Json::as_str) {
                    Some(t) if p.get("type").and_then(Json::as_str) == Some("text") => {
                        let mut p = p.clone();
                        p["text"] = Json::from(strip_billing(t)?);
                        Some(p)
                    }
                    _ => Some(p.clone()),
                })
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

/// `body["messages"]` as template values.
pub(crate) fn conversation(body: &Json) -> Result<Value, TokenizeError> {
    let bad = |m: String| TokenizeError::BadMessages(m);
    let messages = match body.get("messages") {
        Some(Json::Array(m)) => m,
        Some(_) => return Err(bad("\"messages\" is not an array".into())),
        None => return Err(bad("no \"messages\"".into())),
    };
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let Json::Object(message) = message else {
            return Err(bad(format!("messages[{i}] is not an object")));
        };
        let Some(Json::String(role)) = message.get("role") else {
            return Err(bad(format!("messages[{i}] has no string \"role\"")));
        };
        let stripped = (role == "system")
            .then(|| without_billing(message.get("content")))
            .flatten();
        let content = flatten(stripped.as_ref().or(message.get("content")))
            .map_err(|e| bad(format!("messages[{i}]: {e}")))?;
        let mut fields = vec![
            ("role", Value::from(role.as_str())),
            ("content", Value::from(content)),
        ];
        let reasoning = message.get("reasoning").filter(|v| !v.is_null());
        for key in PASSED {
            if let Some(v) = message.get(key).filter(|v| !v.is_null()) {
                // vLLM gives an assistant's `reasoning` as both names.
                if key == "reasoning_content" && role == "assistant" && reasoning.is_some() {
                    continue;
                }
                fields.push((key, to_value(v)));
            }
        }
        if let (Some(r), "assistant") = (reasoning, role.as_str()) {
            fields.push(("reasoning_content", to_value(r)));
        }
        if let Some(calls) = message.get("tool_calls").filter(|v| !v.is_null()) {
            let Json::Array(calls) = calls else {
                return Err(bad(format!("messages[{i}].tool_calls is not an array")));
            };
            fields.push((
                "tool_calls",
                Value::from(calls.iter().map(tool_call).collect::<Vec<_>>()),
            ));
        }
        out.push(Value::from_pairs(fields));
    }
    Ok(Value::from(out))
}

/// `body["tools"]` as vLLM hands them to the template: each one pydantic's
/// `model_dump()` of its `ChatCompletionToolsParam`, so fields in declaration
/// order (`type`, `function` with `name`, `description`, `parameters`, absent
/// optional ones as null), then any extra fields the client sent.
pub(crate) fn tools(tools: &[Json]) -> Result<Value, TokenizeError> {
    let bad = |m: String| TokenizeError::BadMessages(m);
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let (Json::Object(tool), Some(Json::Object(function))) = (tool, tool.get("function"))
        else {
            return Err(bad(format!(
                "tools[{i}] is not an object with an object \"function\""
            )));
        };
        let Some(Json::String(name)) = function.get("name") else {
            return Err(bad(format!("tools[{i}].function has no string \"name\"")));
        };
        let field = |k: &str| function.get(k).map_or(Value::from(()), to_value);
        let mut f = vec![
            ("name", Value::from(name.as_str())),
            ("description", field("description")),
            ("parameters", field("parameters")),
        ];
        f.extend(
            function
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "name" | "description" | "parameters"))
                .map(|(k, v)| (k.as_str(), to_value(v))),
        );
        let kind = tool.get("type").map_or(Value::from("function"), to_value);
        let mut t = vec![("type", kind), ("function", Value::from_pairs(f))];
        t.extend(
            tool.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "type" | "function"))
                .map(|(k, v)| (k.as_str(), to_value(v))),
        );
        out.push(Value::from_pairs(t));
    }
    Ok(Value::from(out))
}

/// One message's content as the single string vLLM renders.
fn flatten(content: Option<&Json>) -> Result<String, String> {
    match content {
        None | Some(Json::Null) => Ok(String::new()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(Json::Array(parts)) => {
            let mut texts = Vec::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Json::as_str);
                if kind.is_none_or(|k| TEXT_PARTS.contains(&k)) {
                    match part.get("text") {
                        Some(Json::String(t)) => texts.push(t.as_str()),
                        _ if kind.is_none() => {} // not a text part at all
                        _ => return Err(format!("content[{j}] has no string \"text\"")),
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err("\"content\" is neither a string, an array nor null".into()),
    }
}

/// A tool call, with `function.arguments` parsed when it is a JSON string
/// (left a string when it does not parse, as vLLM's fallback does).
fn tool_call(call: &Json) -> Value {
    let Some(args) = call.pointer("/function/arguments").and_then(Json::as_str) else {
        return to_value(call);
    };
    let Ok(parsed) = serde_json::from_str::<Json>(args) else {
        return to_value(call);
    };
    let mut call = call.clone();
    if let Some(slot) = call.pointer_mut("/function/arguments") {
        *slot = parsed;
    }
    to_value(&call)
}

/// JSON → template value (minijinja 3 does not take serde values directly).
pub(crate) fn to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (None, Some(u), _) => Value::from(u),
            (None, None, Some(f)) => Value::from(f),
            (None, None, None) => Value::from(n.to_string()),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), to_value(v)))),
    }
}
