//! The error of [`crate::parse_strict`]: what went wrong, and where.

use std::fmt;

/// What made a body unacceptable as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JsonErrorKind {
    /// Empty or whitespace-only body.
    Empty,
    /// Bytes that are not UTF-8 (RFC 8259 §8.1 requires it).
    InvalidUtf8,
    /// Not JSON: unexpected character, early end, trailing data, bad escape …
    Syntax,
    /// The same member name twice in one object (compared after unescaping).
    DuplicateKey,
    /// Arrays/objects nested deeper than [`crate::MAX_DEPTH`].
    TooDeep,
    /// A number whose magnitude does not fit an IEEE 754 double.
    NumberOutOfRange,
    /// A `\uD800`–`\uDFFF` escape that is not half of a valid surrogate pair.
    LoneSurrogate,
}

impl JsonErrorKind {
    /// A stable snake_case name, fit for a metric label or an OpenAI error `code`.
    pub fn as_str(self) -> &'static str {
        match self {
            JsonErrorKind::Empty => "empty_body",
            JsonErrorKind::InvalidUtf8 => "invalid_utf8",
            JsonErrorKind::Syntax => "invalid_json",
            JsonErrorKind::DuplicateKey => "duplicate_key",
            JsonErrorKind::TooDeep => "too_deep",
            JsonErrorKind::NumberOutOfRange => "number_out_of_range",
            JsonErrorKind::LoneSurrogate => "lone_surrogate",
        }
    }
}

/// A body rejected by [`crate::parse_strict`]. `Display` is a sentence meant for
/// the client, naming line and column (1-based) when there is a position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    kind: JsonErrorKind,
    message: String,
    line: usize,
    column: usize,
}

impl JsonError {
    pub(crate) fn new(kind: JsonErrorKind, message: String, line: usize, column: usize) -> Self {
        Self {
            kind,
            message,
            line,
            column,
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> JsonErrorKind {
        self.kind
    }

    /// 1-based line of the fault, or 0 when it has no position (an empty body).
    pub fn line(&self) -> usize {
        self.line
    }

    /// 1-based column of the fault in bytes, or 0 when it has no position.
    pub fn column(&self) -> usize {
        self.column
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for JsonError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_the_message_and_accessors_report_position() {
        let e = JsonError::new(JsonErrorKind::Syntax, "bad at line 2 column 3".into(), 2, 3);
        assert_eq!(e.to_string(), "bad at line 2 column 3");
        assert_eq!(
            (e.kind(), e.line(), e.column()),
            (JsonErrorKind::Syntax, 2, 3)
        );
    }

    #[test]
    fn kind_names_are_distinct() {
        let kinds = [
            JsonErrorKind::Empty,
            JsonErrorKind::InvalidUtf8,
            JsonErrorKind::Syntax,
            JsonErrorKind::DuplicateKey,
            JsonErrorKind::TooDeep,
            JsonErrorKind::NumberOutOfRange,
            JsonErrorKind::LoneSurrogate,
        ];
        let names: std::collections::HashSet<_> = kinds.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), kinds.len());
    }
}
