//! A string that stops growing at a fixed number of characters, so window
//! builders can feed it whole messages and still do O(window) work.

use crate::scan;

/// First of the control characters the chat window reserves as separators
/// (U+001A..=U+001F); see `chat.rs`.
pub(crate) const RESERVED_FIRST: char = '\u{1a}';
/// Escape put before a reserved character that occurs in client text.
pub(crate) const ESC: char = '\u{1b}';

/// Bytes reserved up front.
const FIRST_CAPACITY: usize = 1024;

/// Collects at most `limit` characters (Unicode scalar values).
pub(crate) struct CharBudget {
    out: String,
    left: usize,
}

impl CharBudget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            // Most prompts' windows fit: one allocation instead of a few regrowths.
            out: String::with_capacity(limit.min(FIRST_CAPACITY)),
            left: limit,
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.left == 0
    }

    /// Characters still to collect.
    pub(crate) fn remaining(&self) -> usize {
        self.left
    }

    /// Bytes collected so far.
    pub(crate) fn byte_len(&self) -> usize {
        self.out.len()
    }

    pub(crate) fn into_string(self) -> String {
        self.out
    }

    pub(crate) fn push(&mut self, c: char) {
        if self.left > 0 {
            self.out.push(c);
            self.left -= 1;
        }
    }

    /// Appends as much of `s` as fits, verbatim.
    pub(crate) fn push_raw(&mut self, s: &str) {
        if self.left == 0 {
            return;
        }
        let (bytes, chars) = prefix_of_chars(s, self.left);
        self.out.push_str(s.get(..bytes).unwrap_or_default());
        self.left -= chars;
    }

    /// Appends as much of `s` as fits, putting [`ESC`] before each reserved
    /// separator so client text can never forge one.
    pub(crate) fn push_escaped(&mut self, mut s: &str) {
        while !self.is_full() {
            let Some(at) = scan::find(s.as_bytes(), is_reserved) else {
                self.push_raw(s);
                return;
            };
            // Reserved characters are ASCII, so `at` and `at + 1` are boundaries.
            self.push_raw(s.get(..at).unwrap_or_default());
            self.push(ESC);
            self.push_raw(s.get(at..at + 1).unwrap_or_default());
            s = s.get(at + 1..).unwrap_or_default();
        }
    }
}

fn is_reserved(b: u8) -> bool {
    b.wrapping_sub(RESERVED_FIRST as u8) < 6
}

/// Length in bytes and in characters of the longest prefix of `s` holding at most
/// `max_chars` characters. Counts UTF-8 lead bytes a block at a time instead of
/// decoding, so a 1 MiB string costs microseconds.
pub(crate) fn prefix_of_chars(s: &str, max_chars: usize) -> (usize, usize) {
    let bytes = s.as_bytes();
    if bytes.len() <= max_chars {
        // Never more characters than bytes: all of it fits.
        return (bytes.len(), s.chars().count());
    }
    let is_lead = |b: &u8| (*b as i8) >= -0x40;
    let mut chars = 0;
    let mut base = 0;
    for block in bytes.chunks(64) {
        let n = block.iter().filter(|b| is_lead(b)).count();
        if chars + n > max_chars {
            // The (max_chars + 1)-th character starts in this block: stop before it.
            for (i, b) in block.iter().enumerate() {
                if is_lead(b) {
                    if chars == max_chars {
                        return (base + i, chars);
                    }
                    chars += 1;
                }
            }
        }
        chars += n;
        base += block.len();
    }
    (bytes.len(), chars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_of_chars_matches_char_indices() {
        let s = "aé€😀".repeat(40) + "tail";
        for max in [0, 1, 2, 3, 4, 5, 63, 64, 65, 100, 163, 164, 1_000] {
            let expected_bytes = s.char_indices().nth(max).map_or(s.len(), |(i, _)| i);
            let expected_chars = s[..expected_bytes].chars().count();
            assert_eq!(
                prefix_of_chars(&s, max),
                (expected_bytes, expected_chars),
                "max {max}"
            );
        }
    }

    #[test]
    fn push_raw_stops_at_the_limit() {
        let mut b = CharBudget::new(5);
        b.push_raw("😀é");
        assert!(!b.is_full());
        b.push_raw("abcdef");
        assert!(b.is_full());
        b.push_raw("more");
        b.push('x');
        assert_eq!(b.into_string(), "😀éabc");
    }

    #[test]
    fn push_escaped_escapes_reserved_characters_only() {
        let mut b = CharBudget::new(100);
        b.push_escaped("a\u{19}\u{1a}b\u{1f}\u{20}\n");
        assert_eq!(b.into_string(), "a\u{19}\u{1b}\u{1a}b\u{1b}\u{1f} \n");
    }

    #[test]
    fn escapes_count_against_the_limit() {
        let mut b = CharBudget::new(2);
        b.push_escaped("\u{1e}\u{1e}");
        assert_eq!(b.into_string(), "\u{1b}\u{1e}");
        let mut b = CharBudget::new(3);
        b.push_escaped("\u{1e}\u{1e}");
        assert_eq!(b.into_string(), "\u{1b}\u{1e}\u{1b}");
    }
}
