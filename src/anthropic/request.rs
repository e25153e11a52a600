//! What a Messages body must hold beyond its prompt (`max_tokens`), and the
//! session hint it may carry (`metadata.user_id`).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Longest session hint kept; Anthropic caps `metadata.user_id` at 256.
pub const MAX_SESSION_CHARS: usize = 256;

/// `max_tokens`: required on `/v1/messages` (not on `count_tokens`), a
/// positive integer, as Anthropic's API and vLLM's both insist.
pub fn check_max_tokens(body: &Map<String, Value>) -> Result<(), ApiError> {
    match body.get("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => Ok(()),
        Some(_) => Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: expected an integer of at least 1",
        )),
        None => Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: Field required",
        )),
    }
}

/// The session hint: `metadata.user_id`, which Claude Code fills with its
/// session id. It keeps a session's requests on one instance before their
/// prefix is long enough to; it never crosses tenants (the key is salted by
/// tenant first) and never scopes cache matching (sub-agents and new
/// sessions still find the shared system prompt).
pub fn session(body: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid(
                "metadata",
                "metadata: expected an object",
            ));
        }
    };
    match metadata.get("user_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s))
            if s.chars().count() <= MAX_SESSION_CHARS && !s.chars().any(char::is_control) =>
        {
            Ok((!s.is_empty()).then(|| s.clone()))
        }
        Some(_) => Err(ApiError::invalid(
            "metadata.user_id",
            "metadata.user_id: expected a string of at most 256 characters without control characters",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn max_tokens_is_a_positive_integer() {
        assert!(check_max_tokens(&obj(json!({"max_tokens": 1}))).is_ok());
        for bad in [
            json!({}),
            json!({"max_tokens": 0}),
            json!({"max_tokens": -1}),
            json!({"max_tokens": 1.5}),
            json!({"max_tokens": "8"}),
        ] {
            let e = check_max_tokens(&obj(bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("max_tokens"));
        }
    }

    #[test]
    fn the_session_is_metadata_user_id() {
        assert_eq!(session(&obj(json!({}))).unwrap(), None);
        assert_eq!(
            session(&obj(json!({"metadata": {"user_id": ""}}))).unwrap(),
            None
        );
        assert_eq!(
            session(&obj(json!({"metadata": {"user_id": "session_1"}}))).unwrap(),
            Some("session_1".to_owned())
        );
        assert!(session(&obj(json!({"metadata": []}))).is_err());
        assert!(session(&obj(json!({"metadata": {"user_id": 3}}))).is_err());
        assert!(session(&obj(json!({"metadata": {"user_id": "a\u{0}b"}}))).is_err());
        assert!(session(&obj(json!({"metadata": {"user_id": "x".repeat(257)}}))).is_err());
    }
}
