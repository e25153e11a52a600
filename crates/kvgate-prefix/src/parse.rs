//! Strict parsing of request bodies into `serde_json::Value`.
//!
//! serde_json alone already refuses invalid UTF-8 in strings, lone surrogate
//! escapes, numbers beyond `f64` and nesting past its recursion limit, but it lets
//! a later duplicate member silently replace an earlier one. RFC 8785 forbids
//! duplicates and two parsers may keep different copies (a smuggling vector), so
//! the [`StrictValue`] seed below builds the `Value` itself and refuses them as it
//! goes: one map lookup per member, no second pass, no extra allocation.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};

use crate::json_error::{JsonError, JsonErrorKind};

/// Deepest nesting of arrays and objects accepted: serde_json's recursion limit
/// (it refuses the 128th level). It also bounds the stack used here and by
/// every recursive walk of a parsed value.
pub const MAX_DEPTH: usize = 127;

/// Message prefix of our own duplicate-key error, which is how it is told apart
/// from serde_json's errors after passing through `serde_json::Error`.
const DUPLICATE_KEY: &str = "duplicate object key";
/// Longest piece of a duplicate key quoted back in the error message.
const QUOTED_KEY_CHARS: usize = 64;

/// Parses a request body strictly: it must be UTF-8, non-blank, one JSON value
/// (RFC 8259) with only whitespace around it, no duplicate member names at any
/// depth, nesting no deeper than [`MAX_DEPTH`], numbers within `f64` range and
/// no lone surrogate escapes. Each refusal has its own [`JsonErrorKind`].
///
/// Never panics; memory is O(`bytes.len()`), as nesting is bounded by
/// [`MAX_DEPTH`] and every `Value` node stands for at least one input byte.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, JsonError> {
    let text = std::str::from_utf8(bytes).map_err(|e| invalid_utf8(bytes, e.valid_up_to()))?;
    if text
        .bytes()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Err(JsonError::new(
            JsonErrorKind::Empty,
            "request body is empty; expected a JSON value".to_owned(),
            0,
            0,
        ));
    }
    // `from_str` skips serde_json's own UTF-8 checks: they were done just above.
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictValue.deserialize(&mut de).map_err(from_serde)?;
    de.end().map_err(from_serde)?;
    Ok(value)
}

fn invalid_utf8(bytes: &[u8], valid_up_to: usize) -> JsonError {
    let before = bytes.get(..valid_up_to).unwrap_or_default();
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = valid_up_to - line_start + 1;
    JsonError::new(
        JsonErrorKind::InvalidUtf8,
        format!(
            "request body is not valid UTF-8: invalid byte at offset {valid_up_to} \
             (line {line} column {column})"
        ),
        line,
        column,
    )
}

fn from_serde(e: serde_json::Error) -> JsonError {
    let text = e.to_string();
    // serde_json exposes only coarse categories, so the kind is read from its
    // message; the unit tests pin every message relied on here.
    let kind = if text.starts_with(DUPLICATE_KEY) {
        JsonErrorKind::DuplicateKey
    } else if text.starts_with("recursion limit exceeded") {
        JsonErrorKind::TooDeep
    } else if text.starts_with("number out of range") {
        JsonErrorKind::NumberOutOfRange
    } else if text.starts_with("lone leading surrogate in hex escape")
        || text.starts_with("unexpected end of hex escape")
    {
        JsonErrorKind::LoneSurrogate
    } else {
        JsonErrorKind::Syntax
    };
    let message = match kind {
        JsonErrorKind::TooDeep => {
            format!("request body nests arrays/objects deeper than {MAX_DEPTH} levels: {text}")
        }
        _ => format!("request body is not valid JSON: {text}"),
    };
    JsonError::new(kind, message, e.line(), e.column())
}

/// Deserializes one JSON value, refusing duplicate member names at any depth.
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        // serde_json counts depth inside `deserialize_any`, so recursion through
        // this seed is bounded by its limit.
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        // serde_json's parser never hands over a non-finite float; refuse one
        // anyway rather than turn it into `null`.
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(StrictValue)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            // Checked before the value is read so the error points at the key.
            match map.entry(key) {
                Entry::Occupied(seen) => {
                    let quoted: String = seen.key().chars().take(QUOTED_KEY_CHARS).collect();
                    return Err(A::Error::custom(format_args!("{DUPLICATE_KEY} {quoted:?}")));
                }
                Entry::Vacant(slot) => {
                    slot.insert(access.next_value_seed(StrictValue)?);
                }
            }
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(bytes: &[u8]) -> JsonErrorKind {
        parse_strict(bytes).unwrap_err().kind()
    }

    #[test]
    fn parses_valid_json_like_serde_json() {
        let text = r#" {"a": [1, -2, 3.5, true, false, null, "x\u0041\n"], "b": {"c": {}}} "#;
        assert_eq!(
            parse_strict(text.as_bytes()).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert_eq!(parse_strict(b"7").unwrap(), json!(7));
        assert_eq!(parse_strict(b"\"s\"").unwrap(), json!("s"));
    }

    #[test]
    fn empty_and_whitespace_bodies_are_empty() {
        assert_eq!(kind(b""), JsonErrorKind::Empty);
        assert_eq!(kind(b" \t\r\n  \n"), JsonErrorKind::Empty);
        // Form feed is not JSON whitespace: that is a syntax error, not emptiness.
        assert_eq!(kind(b"\x0c"), JsonErrorKind::Syntax);
    }

    #[test]
    fn invalid_utf8_is_reported_with_its_position() {
        let e = parse_strict(b"{\"a\":\n  \"\xff\"}").unwrap_err();
        assert_eq!(e.kind(), JsonErrorKind::InvalidUtf8);
        assert_eq!((e.line(), e.column()), (2, 4));
        assert!(e.to_string().contains("offset 9"), "{e}");
        // Overlong encoding of '/' and a UTF-16 surrogate encoded in UTF-8.
        assert_eq!(kind(b"\"\xc0\xaf\""), JsonErrorKind::InvalidUtf8);
        assert_eq!(kind(b"\"\xed\xa0\x80\""), JsonErrorKind::InvalidUtf8);
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = parse_strict(b"{\n\"a\": tru}").unwrap_err();
        assert_eq!(e.kind(), JsonErrorKind::Syntax);
        assert_eq!(e.line(), 2);
        assert!(e.to_string().contains("line 2 column"), "{e}");
        for bad in [
            &b"{\"a\":1,}"[..],
            b"[1,]",
            b"{\"a\" 1}",
            b"01",
            b"NaN",
            b"Infinity",
            b"\"\x01\"",
            b"'a'",
            b"{} {}",
            b"[1] x",
            b"\"\\x41\"",
            b"\xef\xbb\xbf{}",
        ] {
            assert_eq!(
                kind(bad),
                JsonErrorKind::Syntax,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert_eq!(kind(br#"{"a":1,"a":2}"#), JsonErrorKind::DuplicateKey);
        assert_eq!(
            kind(br#"{"x":[{"b":{"c":1,"d":2,"c":3}}]}"#),
            JsonErrorKind::DuplicateKey
        );
        // Equal after unescaping is still a duplicate.
        let e = parse_strict(br#"{"a":1,"\u0061":2}"#).unwrap_err();
        assert_eq!(e.kind(), JsonErrorKind::DuplicateKey);
        assert!(e.to_string().contains("\"a\""), "{e}");
        // Column of the key's closing quote: before its value is even read.
        assert_eq!((e.line(), e.column()), (1, 15));
        // Same key in sibling objects is fine.
        assert!(parse_strict(br#"[{"a":1},{"a":2}]"#).is_ok());
    }

    #[test]
    fn duplicate_key_message_quotes_a_bounded_prefix() {
        let long = "k".repeat(10_000);
        let body = format!(r#"{{"{long}":1,"{long}":2}}"#);
        let e = parse_strict(body.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), JsonErrorKind::DuplicateKey);
        assert!(e.to_string().len() < 300, "{}", e.to_string().len());
    }

    fn nested(depth: usize) -> Vec<u8> {
        let mut s = vec![b'['; depth];
        s.extend(std::iter::repeat_n(b']', depth));
        s
    }

    #[test]
    fn nesting_limit_is_max_depth() {
        assert!(parse_strict(&nested(MAX_DEPTH)).is_ok());
        assert_eq!(kind(&nested(MAX_DEPTH + 1)), JsonErrorKind::TooDeep);
        let objects = "{\"a\":".repeat(MAX_DEPTH + 1) + "1" + &"}".repeat(MAX_DEPTH + 1);
        assert_eq!(kind(objects.as_bytes()), JsonErrorKind::TooDeep);
    }

    #[test]
    fn depth_100_000_errors_without_overflowing_the_stack() {
        assert_eq!(kind(&nested(100_000)), JsonErrorKind::TooDeep);
        assert_eq!(kind(&vec![b'['; 100_000]), JsonErrorKind::TooDeep);
    }

    #[test]
    fn numbers_beyond_f64_are_out_of_range() {
        let huge = format!("1{}", "0".repeat(9_999));
        assert_eq!(kind(huge.as_bytes()), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind(b"[-1e400]"), JsonErrorKind::NumberOutOfRange);
        assert_eq!(kind(b"{\"n\":1.8e308}"), JsonErrorKind::NumberOutOfRange);
        // Long but in range, and underflow to zero, are fine.
        let long = format!("0.{}1", "0".repeat(9_998));
        assert_eq!(parse_strict(long.as_bytes()).unwrap(), json!(0.0));
        assert_eq!(
            parse_strict(b"1.7976931348623157e308").unwrap(),
            json!(f64::MAX)
        );
    }

    #[test]
    fn lone_surrogates_are_refused() {
        for bad in [
            &br#""\ud800""#[..],
            br#""\udc00""#,
            br#""\ud800x""#,
            br#""\ud800\u0041""#,
            br#""\ud800\ud800""#,
            br#"{"\udfff":1}"#,
        ] {
            assert_eq!(
                kind(bad),
                JsonErrorKind::LoneSurrogate,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(parse_strict(br#""\ud83d\ude00""#).unwrap(), json!("😀"));
    }

    #[test]
    fn big_integers_become_doubles_and_negative_zero_parses() {
        assert!(parse_strict(b"18446744073709551615").unwrap().is_u64());
        assert!(parse_strict(b"18446744073709551616").unwrap().is_f64());
        assert!(parse_strict(b"-0").is_ok());
    }
}
