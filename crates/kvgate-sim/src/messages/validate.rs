//! What vLLM's `AnthropicMessagesRequest` (and `AnthropicCountTokensRequest`)
//! accept, checked before anything is converted: a 400 naming the field for a
//! body that is not a JSON object, a missing or non-positive `max_tokens`,
//! `messages` that is not a non-empty list of `user` / `assistant` / `system`
//! turns, a content block of an unknown type or with a field of the wrong
//! type, a tool without a `name` or an object `input_schema`. Unknown
//! top-level fields are ignored, as vLLM does.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Content block types vLLM's `AnthropicContentBlock` knows.
const BLOCK_TYPES: [&str; 9] = [
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
];

/// Block fields and the JSON types each may have (null always allowed).
const FIELDS: [(&str, &str); 11] = [
    ("text", "string"),
    ("id", "string"),
    ("tool_use_id", "string"),
    ("name", "string"),
    ("thinking", "string"),
    ("signature", "string"),
    ("data", "string"),
    ("tool_name", "string"),
    ("source", "object"),
    ("input", "object"),
    ("content", "string or array"),
];

/// A checked body, borrowing the parsed JSON.
#[derive(Debug)]
pub(crate) struct Body<'a> {
    pub raw: &'a Map<String, Value>,
    pub model: &'a str,
    pub messages: &'a [Value],
    pub system: Option<&'a Value>,
    pub tools: Option<&'a [Value]>,
    /// Set when the body is a generation request.
    pub max_tokens: Option<u64>,
    pub stream: bool,
}

fn bad(message: impl Into<String>, param: &'static str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

/// The body as JSON, which must be an object.
pub(crate) fn parse(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        let msg = "the request body must be a JSON object";
        return Err(ApiError::bad_request(msg, None));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))
}

/// Check `value`; `generate`: `max_tokens` is required.
pub(crate) fn check(value: &Value, generate: bool) -> Result<Body<'_>, ApiError> {
    let raw = value
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object", None))?;
    let model = match raw.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.as_str(),
        _ => return Err(bad("`model` is required (a non-empty string)", "model")),
    };
    let max_tokens = if generate {
        let n = raw
            .get("max_tokens")
            .ok_or_else(|| bad("`max_tokens` is required", "max_tokens"))?;
        match (n.as_u64(), n.as_i64()) {
            (Some(n), _) if n > 0 => Some(n),
            (_, Some(_)) => return Err(bad("`max_tokens` must be positive", "max_tokens")),
            _ => return Err(bad("`max_tokens` must be an integer", "max_tokens")),
        }
    } else {
        None
    };
    let stream = match raw.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`stream` must be a boolean", "stream")),
    };
    let messages = match raw.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m.as_slice(),
        Some(Value::Array(_)) => return Err(bad("`messages` must not be empty", "messages")),
        Some(_) => return Err(bad("`messages` must be a list", "messages")),
        None => return Err(bad("`messages` is required", "messages")),
    };
    for (i, m) in messages.iter().enumerate() {
        message(m).map_err(|e| bad(format!("messages[{i}]{e}"), "messages"))?;
    }
    let system = raw.get("system").filter(|s| !s.is_null());
    match system {
        None | Some(Value::String(_)) => {}
        Some(Value::Array(blocks)) => {
            blocks_ok(blocks, true).map_err(|e| bad(format!("system{e}"), "system"))?;
        }
        Some(_) => {
            return Err(bad(
                "`system` must be a string or a list of blocks",
                "system",
            ));
        }
    }
    let tools = match raw.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) => Some(t.as_slice()),
        Some(_) => return Err(bad("`tools` must be a list", "tools")),
    };
    for (i, t) in tools.unwrap_or_default().iter().enumerate() {
        let ok = t["name"].is_string()
            && t["input_schema"].is_object()
            && (t["description"].is_null() || t["description"].is_string());
        if !ok {
            let msg = format!("tools[{i}] needs a string `name` and an object `input_schema`");
            return Err(bad(msg, "tools"));
        }
    }
    if !matches!(
        raw.get("metadata"),
        None | Some(Value::Null | Value::Object(_))
    ) {
        return Err(bad("`metadata` must be an object", "metadata"));
    }
    Ok(Body {
        raw,
        model,
        messages,
        system,
        tools,
        max_tokens,
        stream,
    })
}

/// One message; the error is the rest of its path and what is wrong.
fn message(m: &Value) -> Result<(), String> {
    let role = m["role"].as_str().unwrap_or("");
    if !matches!(role, "user" | "assistant" | "system") {
        return Err(": `role` must be user, assistant or system".into());
    }
    match &m["content"] {
        Value::String(_) => Ok(()),
        Value::Array(blocks) => blocks_ok(blocks, role == "system"),
        _ => Err(": `content` must be a string or a list of blocks".into()),
    }
}

fn blocks_ok(blocks: &[Value], system: bool) -> Result<(), String> {
    for (j, b) in blocks.iter().enumerate() {
        let kind = b["type"].as_str().unwrap_or("");
        if !b.is_object() || !BLOCK_TYPES.contains(&kind) {
            return Err(format!(
                ".content[{j}]: unknown content block type {:?}",
                b["type"]
            ));
        }
        if matches!(kind, "tool_addition" | "tool_removal") {
            if !system {
                return Err(format!(
                    ".content[{j}]: {kind} blocks are only allowed in system messages"
                ));
            }
            if !b["tool"].is_object() {
                return Err(format!(
                    ".content[{j}]: `tool` is required for {kind} blocks"
                ));
            }
        }
        for (field, want) in FIELDS {
            let ok = match &b[field] {
                Value::Null => true,
                Value::String(_) => want.starts_with("string"),
                Value::Array(_) => want.ends_with("array"),
                Value::Object(_) => want == "object",
                _ => false,
            };
            if !ok {
                return Err(format!(".content[{j}].{field} must be a {want}"));
            }
        }
    }
    Ok(())
}
