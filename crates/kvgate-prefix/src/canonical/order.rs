//! RFC 8785 §3.2.3 member order: by the names' UTF-16 code units.

use std::cmp::Ordering;

/// Compares by UTF-16 code units without transcoding. UTF-8 byte order is code
/// point order, which agrees with UTF-16 order except between a character in
/// U+E000..=U+FFFF and one above U+FFFF (whose leading surrogate, 0xD800..,
/// sorts first). So compare bytes, and fix up only the first differing character.
pub(crate) fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let Some(i) = a.bytes().zip(b.bytes()).position(|(x, y)| x != y) else {
        return a.len().cmp(&b.len());
    };
    // The common prefix ends mid-character at most; both strings start their
    // differing character at the same offset.
    let start = (0..=i).rev().find(|&j| a.is_char_boundary(j)).unwrap_or(0);
    let first = |s: &str| s.get(start..).and_then(|rest| rest.chars().next());
    match (first(a), first(b)) {
        (Some(x), Some(y)) => utf16_key(x).cmp(&utf16_key(y)),
        _ => a.cmp(b),
    }
}

/// Orders characters as their UTF-16 encodings do: by first code unit, then
/// (for two with the same leading surrogate) by code point.
fn utf16_key(c: char) -> (u32, u32) {
    let cp = u32::from(c);
    let unit = if cp > 0xFFFF {
        0xD800 + ((cp - 0x1_0000) >> 10)
    } else {
        cp
    };
    (unit, cp)
}

#[cfg(test)]
mod tests {
    use super::cmp_utf16;
    use std::cmp::Ordering;

    fn reference(a: &str, b: &str) -> Ordering {
        a.encode_utf16().cmp(b.encode_utf16())
    }

    #[test]
    fn agrees_with_transcoding_on_tricky_pairs() {
        let samples = [
            "",
            "a",
            "ab",
            "b",
            "\u{7f}",
            "\u{80}",
            "é",
            "\u{d7ff}",
            "\u{e000}",
            "\u{ff61}",
            "\u{ffff}",
            "\u{10000}",
            "😀",
            "😁",
            "\u{10ffff}",
            "a😀",
            "a\u{ff61}",
            "a\u{ff61}x",
            "😀a",
        ];
        for a in samples {
            for b in samples {
                assert_eq!(cmp_utf16(a, b), reference(a, b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn supplementary_characters_sort_before_the_top_of_the_bmp() {
        assert_eq!(cmp_utf16("\u{ff61}", "😀"), Ordering::Greater);
        assert!(
            "\u{ff61}" < "😀",
            "UTF-8 order disagrees, which is the point"
        );
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_transcoding_on_any_strings(a in ".{0,6}", b in ".{0,6}", common in ".{0,3}") {
            let (a, b) = (format!("{common}{a}"), format!("{common}{b}"));
            proptest::prop_assert_eq!(cmp_utf16(&a, &b), reference(&a, &b));
        }
    }
}
