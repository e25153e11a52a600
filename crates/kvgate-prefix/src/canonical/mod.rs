//! RFC 8785 (JCS) canonical JSON of a `serde_json::Value`.
//!
//! Written here rather than delegated to `serde_json_canonicalizer`, which the
//! tests keep as the reference implementation (RFC vectors and a differential
//! property test run against both). That crate buffers each object member in its
//! own vectors, re-parses every key to sort it, and copies nested objects once per
//! level: on this machine a 0.9 MB object of small members took 45 ms and a
//! 1 MiB string 0.7 ms. This writer is linear, infallible, and can stop once a
//! byte budget is met, so a window never serialises what it will cut.
//!
//! It assumes serde_json's default number model (u64/i64/finite f64). Its
//! `arbitrary_precision` feature would keep numbers as text beyond `f64`'s
//! range; the parse and RFC vector tests fail if anything turns it on.

mod number;
mod order;
mod string;

pub(crate) use order::cmp_utf16;
use serde_json::Value;

/// Appends the RFC 8785 canonical form of `value` to `out`: members sorted by
/// UTF-16 code units, no insignificant whitespace, numbers as ECMAScript prints
/// doubles, strings with only the escapes JCS requires. Values from
/// [`crate::parse_strict`] are always representable; a non-finite number, which
/// only a hand-built `Value` with serde_json's `arbitrary_precision` could hold,
/// prints as `null`, as `JSON.stringify` does.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    write_until(value, out, usize::MAX);
}

/// Like [`write_canonical`] but may stop once `out.len() >= limit`: what it
/// appends is always a prefix of the canonical form, and all of it whenever
/// `out` ends shorter than `limit`. It may overshoot `limit`; callers truncate.
/// Invariant kept by every arm: nothing is appended after a part that stopped
/// early, which is why each closing byte checks the limit first.
pub(crate) fn write_until(value: &Value, out: &mut Vec<u8>, limit: usize) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => number::write(n, out),
        Value::String(s) => string::write(s, out, limit),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if out.len() >= limit {
                    return;
                }
                if i > 0 {
                    out.push(b',');
                }
                write_until(item, out, limit);
            }
            if out.len() < limit {
                out.push(b']');
            }
        }
        Value::Object(map) => {
            // Sorted here rather than trusting the map's order: it is UTF-8
            // order, and insertion order under serde_json's `preserve_order`.
            let mut members: Vec<_> = map.iter().collect();
            members.sort_unstable_by(|a, b| cmp_utf16(a.0, b.0));
            write_members(members, out, limit);
        }
    }
}

/// Writes an object whose members come in the given order.
pub(crate) fn write_members<'a>(
    members: impl IntoIterator<Item = (&'a String, &'a Value)>,
    out: &mut Vec<u8>,
    limit: usize,
) {
    out.push(b'{');
    for (i, (key, value)) in members.into_iter().enumerate() {
        if out.len() >= limit {
            return;
        }
        if i > 0 {
            out.push(b',');
        }
        string::write(key, out, limit);
        // After any part that may have been cut short, go on only below the
        // limit, or a later byte would follow a gap.
        if out.len() >= limit {
            return;
        }
        out.push(b':');
        write_until(value, out, limit);
    }
    if out.len() < limit {
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canonical(v: &Value) -> String {
        let mut out = Vec::new();
        write_canonical(v, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn sorts_members_strips_whitespace_and_normalises_numbers() {
        let v: Value = serde_json::from_str(
            r#"{ "b" : [1.0, 2e1, -0.0, 1E30], "a": {"d":null, "c":true}, "": false }"#,
        )
        .unwrap();
        assert_eq!(
            canonical(&v),
            r#"{"":false,"a":{"c":true,"d":null},"b":[1,20,0,1e+30]}"#
        );
    }

    #[test]
    fn utf16_member_order_above_the_bmp() {
        let v = json!({"\u{ff61}": 1, "😀": 2, "a": 3});
        assert_eq!(canonical(&v), "{\"a\":3,\"😀\":2,\"\u{ff61}\":1}");
    }

    #[test]
    fn appends_to_existing_bytes() {
        let mut out = b"prefix:".to_vec();
        write_canonical(&json!([1, "a", {}]), &mut out);
        assert_eq!(out, b"prefix:[1,\"a\",{}]");
    }

    #[test]
    fn write_until_gives_a_prefix_that_reaches_the_limit() {
        let v = json!({"z": [1, 2, {"k": "é😀 text"}], "a": "x".repeat(50), "m": null});
        let full = canonical(&v).into_bytes();
        for limit in 0..=full.len() + 2 {
            let mut out = Vec::new();
            write_until(&v, &mut out, limit);
            assert!(full.starts_with(&out), "limit {limit}");
            assert!(
                out.len() >= limit.min(full.len()),
                "limit {limit}: {}",
                out.len()
            );
        }
    }

    #[test]
    fn write_until_stops_early_on_big_values() {
        let v = json!({"p": "x".repeat(1 << 20), "q": vec![0; 100_000]});
        let mut out = Vec::new();
        write_until(&v, &mut out, 100);
        assert!(out.len() < 200, "{}", out.len());
    }
}
