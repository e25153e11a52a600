//! Request bodies of the three generation APIs → one [`Job`], with every malformed or
//! unsupported input turned into a 400 that names the field.
//!
//! Chat messages go through a fixed template, so the prompt the cache sees is
//! deterministic: `<|tools|>\n{tools JSON}\n` when tools are given, then per message
//! `<|{role}|>\n{content}\n` (text parts in order, other parts as their JSON, then
//! any `tool_calls` JSON), then the generation prompt `<|assistant|>\n`.
//!
//! With a real tokenizer (`SimConfig::tokenizer`) the prompt is its token ids
//! instead: chat through the tokenizer's chat template, `prompt` as vLLM's
//! completions endpoint tokenizes it, TGI `inputs` with special tokens added.

use kvgate_tokenize::PromptTokenizer;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// Which response format to produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completion,
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    pub api: Api,
    /// Prompt bytes after templating (`SimConfig::bytes_per_token` a token).
    /// Empty when `token_ids` is set.
    pub prompt: Vec<u8>,
    /// The prompt's token ids, when a real tokenizer made them.
    pub token_ids: Option<Vec<u32>>,
    pub max_tokens: Option<u64>,
    pub stream: bool,
    pub include_usage: bool,
    pub cache_salt: Option<String>,
    pub model: Option<String>,
}

/// Every field any of the three APIs reads; unknown fields are ignored, as OpenAI does.
#[derive(Deserialize)]
struct RawBody {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    prompt: Option<Prompt>,
    inputs: Option<String>,
    tools: Option<Value>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    parameters: Option<Parameters>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    cache_salt: Option<String>,
    n: Option<u64>,
}

/// Hugging Face TGI-style parameters (`/invocations` with `inputs`).
#[derive(Deserialize)]
struct Parameters {
    max_new_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
    tool_calls: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Value>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// A body parser, one an API; with a tokenizer the prompt comes out as token ids.
pub(crate) type Parse = fn(&[u8], Option<&PromptTokenizer>) -> Result<Job, ApiError>;

/// A prompt: templated bytes, or a tokenizer's ids.
type Prompted = (Vec<u8>, Option<Vec<u32>>);

/// `POST /v1/chat/completions`.
pub(crate) fn parse_chat(body: &[u8], tok: Option<&PromptTokenizer>) -> Result<Job, ApiError> {
    let (raw, value) = parse(body, tok)?;
    let messages = raw
        .messages
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("`messages` is required", Some("messages")))?;
    let prompt = chat_prompt(messages, &raw, &value, tok)?;
    job(raw, Api::Chat, prompt)
}

/// `POST /v1/completions`.
pub(crate) fn parse_completion(
    body: &[u8],
    tok: Option<&PromptTokenizer>,
) -> Result<Job, ApiError> {
    let (raw, value) = parse(body, tok)?;
    let prompt = raw
        .prompt
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("`prompt` is required", Some("prompt")))?;
    let prompt = completion_prompt(prompt, &value, tok)?;
    job(raw, Api::Completion, prompt)
}

/// `POST /invocations`: `messages`, else `prompt`, else `inputs`; answered as chat.
pub(crate) fn parse_invocation(
    body: &[u8],
    tok: Option<&PromptTokenizer>,
) -> Result<Job, ApiError> {
    let (raw, value) = parse(body, tok)?;
    let prompt = if let Some(messages) = raw.messages.as_deref() {
        chat_prompt(messages, &raw, &value, tok)?
    } else if let Some(prompt) = raw.prompt.as_ref() {
        completion_prompt(prompt, &value, tok)?
    } else if let Some(inputs) = raw.inputs.as_ref() {
        match tok {
            Some(tok) => (Vec::new(), Some(tok.encode(inputs, true))),
            None => (inputs.as_bytes().to_vec(), None),
        }
    } else {
        let msg = "the body needs `messages`, `prompt` or `inputs`";
        return Err(ApiError::bad_request(msg, None));
    };
    job(raw, Api::Chat, prompt)
}

/// The typed body, and with a tokenizer also the JSON it renders from.
fn parse(body: &[u8], tok: Option<&PromptTokenizer>) -> Result<(RawBody, Value), ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
            None,
        ));
    }
    let invalid =
        |e: serde_json::Error| ApiError::bad_request(format!("invalid request body: {e}"), None);
    if tok.is_none() {
        return Ok((serde_json::from_slice(body).map_err(invalid)?, Value::Null));
    }
    let value: Value = serde_json::from_slice(body).map_err(invalid)?;
    Ok((RawBody::deserialize(&value).map_err(invalid)?, value))
}

fn chat_prompt(
    messages: &[Message],
    raw: &RawBody,
    value: &Value,
    tok: Option<&PromptTokenizer>,
) -> Result<Prompted, ApiError> {
    let Some(tok) = tok else {
        return Ok((render_chat(messages, raw.tools.as_ref())?, None));
    };
    if messages.is_empty() {
        let msg = "`messages` must not be empty";
        return Err(ApiError::bad_request(msg, Some("messages")));
    }
    let tokens = tok
        .chat(value, usize::MAX)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
    Ok((Vec::new(), Some(tokens.ids)))
}

fn completion_prompt(
    prompt: &Prompt,
    value: &Value,
    tok: Option<&PromptTokenizer>,
) -> Result<Prompted, ApiError> {
    // Validated the same way with or without a tokenizer (one prompt, ids in range).
    let bytes = prompt_bytes(prompt)?;
    let Some(tok) = tok else {
        return Ok((bytes, None));
    };
    let tokens = tok
        .completion(&value["prompt"], usize::MAX)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt")))?;
    Ok((Vec::new(), Some(tokens.ids)))
}

fn job(raw: RawBody, api: Api, (prompt, token_ids): Prompted) -> Result<Job, ApiError> {
    if token_ids.as_ref().map_or(prompt.is_empty(), Vec::is_empty) {
        return Err(ApiError::bad_request(
            "the prompt must not be empty",
            Some("prompt"),
        ));
    }
    let max_tokens = raw
        .max_completion_tokens
        .or(raw.max_tokens)
        .or(raw.parameters.and_then(|p| p.max_new_tokens));
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "`max_tokens` must be at least 1",
            Some("max_tokens"),
        ));
    }
    if raw.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request(
            "kvgate-sim only supports `n` = 1",
            Some("n"),
        ));
    }
    if raw.cache_salt.as_deref() == Some("") {
        let msg = "`cache_salt` must be a non-empty string if provided";
        return Err(ApiError::bad_request(msg, Some("cache_salt")));
    }
    Ok(Job {
        api,
        prompt,
        token_ids,
        max_tokens,
        stream: raw.stream.unwrap_or(false),
        include_usage: raw
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        cache_salt: raw.cache_salt,
        model: raw.model,
    })
}

fn render_chat(messages: &[Message], tools: Option<&Value>) -> Result<Vec<u8>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    let mut out = String::new();
    if let Some(tools) = tools.filter(|t| !t.is_null()) {
        out.push_str("<|tools|>\n");
        out.push_str(&tools.to_string());
        out.push('\n');
    }
    for m in messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        match &m.content {
            Some(Content::Text(text)) => out.push_str(text),
            Some(Content::Parts(parts)) => parts.iter().for_each(|p| push_part(&mut out, p)),
            None => {}
        }
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_null()) {
            out.push_str(&calls.to_string());
        }
        out.push('\n');
    }
    out.push_str("<|assistant|>\n");
    Ok(out.into_bytes())
}

/// A text part contributes its text; any other part (image, audio…) its JSON.
fn push_part(out: &mut String, part: &Value) {
    match (part.get("type").and_then(Value::as_str), part.get("text")) {
        (Some("text"), Some(Value::String(text))) => out.push_str(text),
        _ => out.push_str(&part.to_string()),
    }
}

fn prompt_bytes(prompt: &Prompt) -> Result<Vec<u8>, ApiError> {
    let batch = || ApiError::bad_request("kvgate-sim takes one prompt per request", Some("prompt"));
    let tokens = |ids: &[u32]| ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    match prompt {
        Prompt::Text(text) => Ok(text.as_bytes().to_vec()),
        Prompt::Texts(texts) => match texts.as_slice() {
            [one] => Ok(one.as_bytes().to_vec()),
            [] => Ok(Vec::new()),
            _ => Err(batch()),
        },
        // A token id is one simulated token at the default 4 bytes a token: its 4
        // little-endian bytes (at another density, 4/b tokens).
        Prompt::Tokens(ids) => Ok(tokens(ids)),
        Prompt::TokenLists(lists) => match lists.as_slice() {
            [one] => Ok(tokens(one)),
            _ => Err(batch()),
        },
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
