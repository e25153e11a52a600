//! The `tojson` filter as transformers defines it for chat templates:
//! Python's `json.dumps(x, ensure_ascii=False, indent=…, separators=…,
//! sort_keys=…)`. minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for
//! HTML, which would change the tokens of every tool schema.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

struct Style {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

pub(crate) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) => match <[String; 2]>::try_from(seps) {
            Ok([i, k]) => (i, k),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "separators must be a pair",
                ));
            }
        },
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = Style {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn newline(out: &mut String, style: &Style, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    if depth > 256 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "value nested too deeply for tojson",
        ));
    }
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => write_float(out, f64::try_from(value.clone())?),
        ValueKind::String | ValueKind::Plain => {
            write_str(out, &value.to_string(), style.ensure_ascii)
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            write_container(out, style, depth, ('{', '}'), &keys, |out, key| {
                write_str(out, &key.to_string(), style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_value(out, &value.get_item(key)?, style, depth + 1)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Bytes => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, depth, ('[', ']'), &items, |out, item| {
                write_value(out, item, style, depth + 1)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "value is not JSON serializable",
            ));
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    style: &Style,
    depth: usize,
    (open, close): (char, char),
    items: &[Value],
    mut item: impl FnMut(&mut String, &Value) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, style, depth + 1);
        item(out, v)?;
    }
    newline(out, style, depth);
    out.push(close);
    Ok(())
}

/// Python's `float.__repr__`: shortest round-trip digits, exponent form
/// below 1e-4 and from 1e16 on, `NaN`/`Infinity` as json.dumps writes them.
fn write_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f == 0.0 || (1e-4..1e16).contains(&f.abs()) {
        let s = f.to_string();
        out.push_str(&s);
        if !s.contains('.') {
            out.push_str(".0");
        }
    } else {
        let s = format!("{f:e}"); // "1.5e-7", "1e20"
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    }
}

fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
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
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str, indent: Option<usize>) -> String {
        let v = crate::messages::to_value(&serde_json::from_str(json).unwrap_or_default());
        let indent = indent.map(Value::from);
        tojson(
            &v,
            indent,
            Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
        )
        .map(|v| v.to_string())
        .unwrap_or_default()
    }

    #[test]
    fn matches_python_json_dumps() {
        // Expected strings from Python 3: json.dumps(x, ensure_ascii=False).
        assert_eq!(
            dumps(
                r#"{"a": {"x": null, "y": true}, "b": [1, 2.5, "<a&b>'"]}"#,
                None
            ),
            r#"{"a": {"x": null, "y": true}, "b": [1, 2.5, "<a&b>'"]}"#
        );
        assert_eq!(dumps(r#""é\n\u0001""#, None), "\"é\\n\\u0001\"");
        assert_eq!(
            dumps("[1.0, 1e20, 1.5e-7, 0.001, []]", None),
            "[1.0, 1e+20, 1.5e-07, 0.001, []]"
        );
        assert_eq!(
            dumps(r#"{"a": [1, {}]}"#, Some(2)),
            "{\n  \"a\": [\n    1,\n    {}\n  ]\n}"
        );
    }
}
