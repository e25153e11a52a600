//! Where a conversation's own part begins in a chat or Messages window: at
//! its first question, once an answer follows it. What comes before (tools,
//! system prompt) is the *opening*, which other conversations may share; the
//! questions, answers and tool results from there on were written for this
//! conversation alone.
//!
//! Routing uses it to tell a conversation's continuation, held by one instance
//! only because that instance answered its earlier turns, from a new request
//! that merely shares a hot opening (`kvgate_routing::LongestPrefix`). The
//! window builders mark it as they write each message, so it costs no second
//! pass over the prompt. Few-shot examples written as user and assistant
//! turns look like a conversation's own turns: nothing in a body tells them
//! apart.

use serde_json::Value;

use super::budget::CharBudget;

/// A window and where its conversation's own history begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The window, as [`super::chat_window`] or [`super::messages_window`] gives it.
    pub text: String,
    /// The character offset of the first user turn, when an assistant turn
    /// follows it in the window; `None` for a first question (no answer
    /// yet), or a window cut short before the answer.
    pub history_from: Option<usize>,
    /// The byte length of `text` before that first answer, when
    /// `history_from` is set: the opening and the first question, which
    /// name the conversation for as long as it lasts (a sub-agent that forks
    /// its history keeps them).
    pub named_by: Option<usize>,
    /// `history_from` in bytes of `text`: the opening's length.
    pub opening_bytes: Option<usize>,
    /// The character offset of the first user turn, answered or not: a
    /// first question's opening; `None` when the window ends before it.
    pub asked_from: Option<usize>,
}

/// Marks the history's start while a window's messages are written.
#[derive(Debug, Default)]
pub(super) struct HistoryMark {
    /// Where the first user turn begins, in characters and in bytes.
    asked_at: Option<(usize, usize)>,
    /// The window's bytes before the first answer to it.
    answered_at: Option<usize>,
}

impl HistoryMark {
    /// Called before `message` is written to `window` (of `max_chars`).
    pub(super) fn before(&mut self, message: &Value, window: &CharBudget, max_chars: usize) {
        if window.is_full() {
            return;
        }
        match message.get("role").and_then(Value::as_str) {
            Some("user") if self.asked_at.is_none() => {
                self.asked_at = Some((max_chars - window.remaining(), window.byte_len()));
            }
            Some("assistant") if self.asked_at.is_some() && self.answered_at.is_none() => {
                self.answered_at = Some(window.byte_len());
            }
            _ => {}
        }
    }

    pub(super) fn window(self, window: CharBudget) -> Window {
        let asked = self.asked_at.filter(|_| self.answered_at.is_some());
        Window {
            text: window.into_string(),
            history_from: asked.map(|(chars, _)| chars),
            named_by: self.answered_at,
            opening_bytes: asked.map(|(_, bytes)| bytes),
            asked_from: self.asked_at.map(|(chars, _)| chars),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{chat_window_with_history, messages_window_with_history};

    fn chat(body: &Value) -> Window {
        chat_window_with_history(body, 10_000).unwrap()
    }

    #[test]
    fn a_first_question_has_no_history_of_its_own() {
        let body = json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"},
        ]});
        assert_eq!(chat(&body).history_from, None);
        assert_eq!(chat(&body).named_by, None);
    }

    #[test]
    fn history_starts_at_the_first_question_once_it_is_answered() {
        let body = json!({"tools": [{"type": "function"}], "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]});
        let w = chat(&body);
        assert_eq!(w.text, crate::chat_window(&body, 10_000).unwrap());
        let at = w.history_from.unwrap();
        let head: String = w.text.chars().take(at).collect();
        assert!(
            head.ends_with("system\u{1f}You are terse.\u{1e}"),
            "{head:?}"
        );
        let rest: String = w.text.chars().skip(at).collect();
        assert!(rest.starts_with("user\u{1f}hi\u{1e}assistant"), "{rest:?}");
        // Named by everything up to the first answer, whatever follows it.
        let name = &w.text[..w.named_by.unwrap()];
        assert!(
            name.ends_with("You are terse.\u{1e}user\u{1f}hi\u{1e}"),
            "{name:?}"
        );
        let mut later = body.clone();
        later["messages"][3]["content"] = json!("something else");
        let l = chat(&later);
        assert_eq!(&l.text[..l.named_by.unwrap()], name);
    }

    #[test]
    fn a_greeting_before_the_first_question_is_opening() {
        let body = json!({"messages": [
            {"role": "assistant", "content": "Ask me anything."},
            {"role": "user", "content": "hi"},
        ]});
        assert_eq!(chat(&body).history_from, None);
        // Unanswered, its opening is known all the same.
        assert_eq!(chat(&body).asked_from, Some(27));
        let answered = json!({"messages": [
            {"role": "assistant", "content": "Ask me anything."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]});
        // "assistant" US "Ask me anything." RS: 27 characters.
        assert_eq!(chat(&answered).history_from, Some(27));
    }

    #[test]
    fn offsets_count_characters_not_bytes() {
        let body = json!({"messages": [
            {"role": "user", "content": "日本語"},
            {"role": "assistant", "content": "はい"},
        ]});
        let with_system = json!({"messages": [
            {"role": "system", "content": "日本語"},
            {"role": "user", "content": "質問"},
            {"role": "assistant", "content": "はい"},
        ]});
        assert_eq!(chat(&body).history_from, Some(0));
        // "system" US "日本語" RS: 11 characters (17 bytes).
        assert_eq!(chat(&with_system).history_from, Some(11));
        // ... then "user" US "質問" RS: the first answer after 29 bytes.
        assert_eq!(chat(&with_system).named_by, Some(29));
        assert_eq!(chat(&with_system).opening_bytes, Some(17));
        assert_eq!(chat(&with_system).asked_from, Some(11));
    }

    #[test]
    fn a_messages_session_is_its_own_from_its_task_on() {
        let body = json!({
            "system": "You are a coding agent.",
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "fix the build"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
            ],
        });
        let w = messages_window_with_history(&body, 100_000).unwrap();
        assert_eq!(w.text, crate::messages_window(&body, 100_000).unwrap());
        let at = w.history_from.unwrap();
        let rest: String = w.text.chars().skip(at).collect();
        assert!(
            rest.starts_with("user\u{1f}fix the build\u{1e}"),
            "{rest:?}"
        );
        // Named by its opening and task, in bytes of the window.
        let name = &w.text[..w.named_by.unwrap()];
        assert!(name.ends_with("user\u{1f}fix the build\u{1e}"), "{name:?}");
        assert_eq!(w.opening_bytes, Some(at), "ASCII: bytes are characters");
        // Cut where the answer would begin, the window shows no history.
        let answer = at + "user\u{1f}fix the build\u{1e}".chars().count();
        let cut = messages_window_with_history(&body, answer).unwrap();
        assert_eq!(cut.history_from, None);
        assert_eq!(cut.named_by, None);
        let longer = messages_window_with_history(&body, answer + 1).unwrap();
        assert_eq!(longer.history_from, Some(at));
    }
}
