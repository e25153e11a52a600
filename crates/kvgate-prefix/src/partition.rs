//! SageMaker's rule for the `X-Amzn-SageMaker-Prefix-Aware-Id` partition id.

/// Longest partition id accepted, in characters.
pub const MAX_PARTITION_ID_CHARS: usize = 64;

/// SageMaker's `\A\S[\p{Print}]*\z`, 1–64 characters.
///
/// AWS writes its patterns in Java regex syntax, where `\p{Print}` is POSIX
/// `[\x20-\x7E]`; HTTP header values are visible ASCII too. So every character
/// must be printable ASCII and the first must not be a space. Java's `\S` alone
/// would also let a control or non-ASCII character lead; those are refused here.
pub fn is_valid_partition_id(s: &str) -> bool {
    let bytes = s.as_bytes();
    // All-ASCII, so bytes are characters.
    (1..=MAX_PARTITION_ID_CHARS).contains(&bytes.len())
        && bytes.first().is_some_and(|&b| b != b' ')
        && bytes.iter().all(|&b| (0x20..=0x7e).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_printable_ascii_of_1_to_64() {
        for ok in [
            "a",
            "~",
            "team-a/session 42",
            "a ",
            &"x".repeat(64),
            "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        ] {
            assert!(is_valid_partition_id(ok), "{ok:?}");
        }
    }

    #[test]
    fn refuses_empty_too_long_leading_space_and_unprintable() {
        for bad in [
            "",
            &"x".repeat(65),
            " a",
            "\ta",
            "a\tb",
            "a\nb",
            "a\0",
            "a\u{7f}",
            "é",
            "aé",
            "a\u{85}",
        ] {
            assert!(!is_valid_partition_id(bad), "{bad:?}");
        }
    }
}
