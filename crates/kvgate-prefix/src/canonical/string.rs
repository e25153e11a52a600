//! RFC 8785 §3.2.2.2 strings: escape `"`, `\` and U+0000..U+001F only, with the
//! two-character forms where JSON has them and lowercase `\u00xx` otherwise.

use crate::scan;

fn needs_escape(b: u8) -> bool {
    (b < 0x20) | (b == b'"') | (b == b'\\')
}

/// Writes `s` as a canonical string literal, stopping once `out.len() >= limit`.
///
/// Only ASCII bytes are ever escaped and every input byte yields at least one
/// output byte, so escaping a byte prefix of `s` (even one that splits a
/// character) yields a byte prefix of the full literal that reaches `limit`.
pub(super) fn write(s: &str, out: &mut Vec<u8>, limit: usize) {
    out.push(b'"');
    let room = limit.saturating_sub(out.len());
    let all = s.as_bytes();
    let mut rest = all.get(..room).unwrap_or(all);
    let complete = rest.len() == all.len();
    while let Some(at) = scan::find(rest, needs_escape) {
        let (clean, tail) = rest.split_at(at);
        out.extend_from_slice(clean);
        if let Some((&b, after)) = tail.split_first() {
            write_escape(b, out);
            rest = after;
        }
    }
    out.extend_from_slice(rest);
    if complete {
        out.push(b'"');
    }
}

fn write_escape(b: u8, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short: &[u8] = match b {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        0x08 => b"\\b",
        b'\t' => b"\\t",
        b'\n' => b"\\n",
        0x0c => b"\\f",
        b'\r' => b"\\r",
        _ => {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
            return;
        }
    };
    out.extend_from_slice(short);
}

#[cfg(test)]
mod tests {
    use super::write;

    fn literal(s: &str, limit: usize) -> String {
        let mut out = Vec::new();
        write(s, &mut out, limit);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn escapes_only_what_jcs_requires() {
        let s = "\u{0}\u{8}\t\n\u{b}\u{c}\r\u{1f}\"\\/\u{7f}\u{2028}é€😀";
        assert_eq!(
            literal(s, usize::MAX),
            "\"\\u0000\\b\\t\\n\\u000b\\f\\r\\u001f\\\"\\\\/\u{7f}\u{2028}é€😀\""
        );
    }

    #[test]
    fn escapes_in_long_strings_are_all_found() {
        let s = "a".repeat(100) + "\"" + &"b".repeat(100) + "\n";
        let expected = format!("\"{}\\\"{}\\n\"", "a".repeat(100), "b".repeat(100));
        assert_eq!(literal(&s, usize::MAX), expected);
    }

    #[test]
    fn stops_at_the_limit_with_a_prefix() {
        let s = "ab\"cd".repeat(1000);
        let full = literal(&s, usize::MAX);
        let cut = literal(&s, 10);
        assert!(full.starts_with(&cut));
        assert!((10..20).contains(&cut.len()), "{}", cut.len());
    }
}
