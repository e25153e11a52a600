//! The API families whose bodies the gateway knows how to window.

use serde_json::Value;

use crate::window::{ShapeError, chat_window, completions_window, messages_window, native_window};

/// Which API a body belongs to; it decides how the window is taken and in what
/// unit `prefix_length` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI `POST /v1/chat/completions`: window in characters, see [`crate::chat_window`].
    Chat,
    /// OpenAI `POST /v1/completions`: window in characters, see [`crate::completions_window`].
    Completions,
    /// Anthropic `POST /v1/messages`: window in characters, see [`crate::messages_window`].
    Messages,
    /// SageMaker-style Invoke of an arbitrary JSON body: window in bytes, see
    /// [`crate::native_window`].
    Native,
}

impl Api {
    /// Whether `prefix_length` counts characters (Unicode scalar values) rather than
    /// bytes, as SageMaker's `PrefixLength` does for the OpenAI-compatible API.
    pub fn counts_chars(self) -> bool {
        match self {
            Api::Chat | Api::Completions | Api::Messages => true,
            Api::Native => false,
        }
    }

    /// The routing window of `body` for this API, `prefix_length` characters or
    /// bytes long at most (see [`Api::counts_chars`]), ready for
    /// [`crate::routing_key`]. `prompt_members` is used by [`Api::Native`] only.
    pub fn window(
        self,
        body: &Value,
        prompt_members: &[String],
        prefix_length: usize,
    ) -> Result<Vec<u8>, ShapeError> {
        match self {
            Api::Chat => chat_window(body, prefix_length).map(String::into_bytes),
            Api::Completions => completions_window(body, prefix_length).map(String::into_bytes),
            Api::Messages => messages_window(body, prefix_length).map(String::into_bytes),
            Api::Native => Ok(native_window(body, prompt_members, prefix_length)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Api;
    use serde_json::json;

    #[test]
    fn openai_apis_count_chars_and_native_counts_bytes() {
        assert!(Api::Chat.counts_chars());
        assert!(Api::Completions.counts_chars());
        assert!(!Api::Native.counts_chars());
    }

    #[test]
    fn window_dispatches_per_api() {
        let body = json!({"messages": [{"role": "user", "content": "hé"}], "prompt": "hé"});
        assert_eq!(
            Api::Chat.window(&body, &[], 7).unwrap(),
            "user\u{1f}hé".as_bytes()
        );
        assert_eq!(Api::Completions.window(&body, &[], 1).unwrap(), b"h");
        let members = vec!["prompt".to_owned()];
        assert_eq!(
            Api::Native.window(&body, &members, 12).unwrap(),
            b"{\"prompt\":\"h"
        );
        assert_eq!(
            Api::Chat.window(&json!({}), &[], 7).unwrap_err().param,
            "messages"
        );
    }
}
