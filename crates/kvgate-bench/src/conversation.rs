//! A session's conversation as the wire API carries it, and the body of its
//! next request.
//!
//! OpenAI chat: the system prompt as the first message, every turn (a tool
//! result too) a user message, every answer an assistant message.
//!
//! Anthropic Messages, as Claude Code sends it: `system` at the top level (a
//! text block), `max_tokens`, `metadata.user_id` = the session's id (shared by
//! its sub-agents), a user turn as a text block; a tool result as a
//! `tool_result` block answering the previous answer, which is then sent back
//! as the `tool_use` block it stands for (a `Bash` call whose `command` is the
//! answer's text, so the history grows by as much as over chat). The engine
//! renders both into the same chat prompt (vLLM's conversion), so only the
//! tool-call turns' framing differs between the two APIs.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::regime::Api;

/// The headers a Messages client sends besides `content-type` (the
/// benchmark's gateways run without authentication; the key is what
/// Anthropic's SDK would send).
pub const MESSAGES_HEADERS: [(&str, &str); 2] = [
    ("x-api-key", "kvgate-bench"),
    ("anthropic-version", "2023-06-01"),
];

/// One conversation: its history in the API's shape.
#[derive(Clone, Debug)]
pub struct Conversation {
    api: Api,
    system: Option<Arc<str>>,
    messages: Vec<Value>,
    /// `metadata.user_id` (Messages), `prompt_cache_key` (keyed chat).
    session: String,
}

impl Conversation {
    pub fn new(api: Api, system: Option<Arc<str>>, session: String) -> Self {
        let mut messages = Vec::new();
        if let (Api::OpenAi | Api::OpenAiKeyed, Some(system)) = (api, &system) {
            messages.push(json!({"role": "system", "content": &**system}));
        }
        Self {
            api,
            system,
            messages,
            session,
        }
    }

    /// Add a user turn; `tool`: a tool's output answering the last answer.
    pub fn user(&mut self, text: &str, tool: bool) {
        let message = match self.api {
            Api::OpenAi | Api::OpenAiKeyed => json!({"role": "user", "content": text}),
            Api::Messages => match tool.then(|| self.call_last_answer()).flatten() {
                Some(id) => json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id, "content": text}]}),
                None => json!({"role": "user", "content": [{"type": "text", "text": text}]}),
            },
        };
        self.messages.push(message);
    }

    /// Add an answer as received.
    pub fn answer(&mut self, text: &str) {
        self.messages.push(match self.api {
            Api::OpenAi | Api::OpenAiKeyed => json!({"role": "assistant", "content": text}),
            Api::Messages => {
                json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
            }
        });
    }

    /// Turn the last message, a text answer, into the `tool_use` it stands
    /// for; its id, or `None` when the last message is not an answer.
    fn call_last_answer(&mut self) -> Option<String> {
        let id = format!("toolu_{:04}", self.messages.len());
        let last = self
            .messages
            .last_mut()
            .filter(|m| m["role"] == "assistant")?;
        let text = last.pointer("/content/0/text").cloned().unwrap_or_default();
        last["content"] = json!([{"type": "tool_use", "id": id, "name": "Bash",
                                  "input": {"command": text}}]);
        Some(id)
    }

    /// The path and body of the request for the history so far.
    pub fn request(&self, model: &str, max_tokens: u32, stream: bool) -> (&'static str, Value) {
        match self.api {
            Api::OpenAi | Api::OpenAiKeyed => {
                let mut body = json!({
                    "model": model,
                    "messages": self.messages,
                    "max_tokens": max_tokens,
                });
                if self.api == Api::OpenAiKeyed {
                    body["prompt_cache_key"] = json!(self.session);
                }
                ("/v1/chat/completions", streaming(body, stream))
            }
            Api::Messages => {
                let mut body = json!({
                    "model": model,
                    "max_tokens": max_tokens,
                    "messages": self.messages,
                    "metadata": {"user_id": self.session},
                    "stream": stream,
                });
                if let Some(system) = &self.system {
                    body["system"] = json!([{"type": "text", "text": &**system}]);
                }
                ("/v1/messages", body)
            }
        }
    }
}

/// `stream: true` with usage in the last chunk, or `stream: false` (chat and
/// completions).
pub fn streaming(mut body: Value, stream: bool) -> Value {
    if let Some(obj) = body.as_object_mut() {
        obj.insert("stream".to_owned(), Value::Bool(stream));
        if stream {
            obj.insert("stream_options".to_owned(), json!({"include_usage": true}));
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_history_is_plain_messages() {
        let mut c = Conversation::new(Api::OpenAi, Some("sys".into()), "s1".into());
        c.user("task", false);
        c.answer("call");
        c.user("output", true);
        let (path, body) = c.request("m", 7, true);
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(
            body,
            json!({"model": "m", "max_tokens": 7, "stream": true,
                   "stream_options": {"include_usage": true}, "messages": [
                {"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "call"}, {"role": "user", "content": "output"}]})
        );
    }

    #[test]
    fn keyed_chat_names_its_session_and_plain_chat_does_not() {
        let mut keyed = Conversation::new(Api::OpenAiKeyed, Some("sys".into()), "s1".into());
        keyed.user("task", false);
        let (path, body) = keyed.request("m", 7, false);
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(body["prompt_cache_key"], "s1");
        assert_eq!(
            body["messages"][0],
            json!({"role": "system", "content": "sys"})
        );
        let mut plain = Conversation::new(Api::OpenAi, Some("sys".into()), "s1".into());
        plain.user("task", false);
        assert!(
            plain
                .request("m", 7, false)
                .1
                .get("prompt_cache_key")
                .is_none()
        );
    }

    #[test]
    fn messages_history_answers_tool_calls_with_tool_results() {
        let mut c = Conversation::new(Api::Messages, Some("sys".into()), "s1".into());
        c.user("task", false);
        c.answer("ls");
        let fork = c.clone();
        c.user("a.rs b.rs", true);
        let (path, body) = c.request("m", 7, false);
        assert_eq!(path, "/v1/messages");
        assert_eq!(
            body,
            json!({"model": "m", "max_tokens": 7, "stream": false,
                   "system": [{"type": "text", "text": "sys"}],
                   "metadata": {"user_id": "s1"}, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "task"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0002",
                  "name": "Bash", "input": {"command": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0002",
                  "content": "a.rs b.rs"}]}]})
        );
        // A sub-agent's delegation is a text turn: the answer before it stays text.
        let mut fork = fork;
        fork.user("delegate", false);
        let (_, body) = fork.request("m", 7, true);
        assert_eq!(body["messages"][1]["content"][0]["type"], "text");
        assert_eq!(body["stream"], true);
        // A tool result with no answer before it is sent as text.
        let mut first = Conversation::new(Api::Messages, None, "s2".into());
        first.user("out", true);
        let (_, body) = first.request("m", 1, false);
        assert_eq!(body["messages"][0]["content"][0]["type"], "text");
        assert!(body.get("system").is_none());
    }
}
