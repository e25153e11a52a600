//! Finding the first byte of interest in long strings quickly.

/// Index of the first byte matching `pred`.
///
/// Looks at 64-byte blocks with a branch-free fold first, which the compiler
/// vectorises, because the bytes sought (escapes, separators) are rare in
/// prompts; `pred` should use `|` rather than `||` for the same reason.
#[inline]
pub(crate) fn find(bytes: &[u8], pred: impl Fn(u8) -> bool) -> Option<usize> {
    let mut base = 0;
    for block in bytes.chunks(64) {
        if block.iter().fold(false, |hit, &b| hit | pred(b)) {
            return block.iter().position(|&b| pred(b)).map(|i| base + i);
        }
        base += block.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::find;

    #[test]
    fn finds_the_first_match_in_any_block() {
        let mut v = vec![b'x'; 300];
        assert_eq!(find(&v, |b| b == b'!'), None);
        assert_eq!(find(&[], |b| b == b'!'), None);
        v[250] = b'!';
        v[130] = b'!';
        assert_eq!(find(&v, |b| b == b'!'), Some(130));
        v[0] = b'!';
        assert_eq!(find(&v, |b| b == b'!'), Some(0));
    }
}
