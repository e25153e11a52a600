//! Python's `json.dumps(x)` with its defaults (separators `", "` and `": "`,
//! `ensure_ascii`), which vLLM uses for a `tool_use` block's `arguments`.
//! Numbers are written as serde_json writes them (the same for integers).

use std::fmt::Write as _;

use serde_json::Value;

pub(crate) fn dumps(v: &Value) -> String {
    let mut out = String::new();
    write(&mut out, v);
    out
}

fn write(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                string(out, k);
                out.push_str(": ");
                write(out, item);
            }
            out.push('}');
        }
    }
}

/// A string as `ensure_ascii` writes it: printable ASCII as is, the usual
/// short escapes, everything else as `\uXXXX` (UTF-16 units).
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_python_json_dumps() {
        // python3 -c 'import json; print(json.dumps({"a": [1, "é😀\n"], "b": None, "c": {"d": True}}))'
        let v = serde_json::json!({"a": [1, "é😀\n"], "b": null, "c": {"d": true}});
        assert_eq!(
            dumps(&v),
            r#"{"a": [1, "\u00e9\ud83d\ude00\n"], "b": null, "c": {"d": true}}"#
        );
        assert_eq!(dumps(&serde_json::json!({})), "{}");
        assert_eq!(dumps(&serde_json::json!("\u{7f}\"")), r#""\u007f\"""#);
    }
}
