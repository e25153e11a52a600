//! The error of the OpenAI window builders: a body of the wrong shape.

use std::fmt;

/// An OpenAI body whose shape is wrong, naming the offending parameter the way
/// OpenAI's `error.param` does (`messages`, `messages[2].content`, `prompt[0]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    /// Path of the offending parameter.
    pub param: String,
    /// What is wrong with it, as a sentence for the client.
    pub message: String,
}

impl ShapeError {
    pub(crate) fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid '{}': {}", self.param, self.message)
    }
}

impl std::error::Error for ShapeError {}

#[cfg(test)]
mod tests {
    use super::ShapeError;

    #[test]
    fn display_names_the_param() {
        let e = ShapeError::new("messages[2].content", "expected a string");
        assert_eq!(
            e.to_string(),
            "invalid 'messages[2].content': expected a string"
        );
    }
}
