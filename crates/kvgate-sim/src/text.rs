//! Deterministic filler text: prompt blocks for Mooncake trace ids and output tokens.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::tokens::BYTES_PER_TOKEN;

/// Deterministic text for a Mooncake trace block id: `tokens` simulated tokens
/// (`4 × tokens` ASCII bytes: three lowercase letters and a space each).
///
/// The same id always gives the same text and different ids give different text,
/// so a request built by concatenating the texts of its `hash_ids` shares exactly
/// the trace's reusable prefix with other requests. Mooncake blocks are 512
/// tokens, a multiple of the simulator's 16-token KV block.
pub fn block_text(hash_id: u64, tokens: usize) -> String {
    let mut out = String::with_capacity(tokens * BYTES_PER_TOKEN);
    let mut state = xxh3_64_with_seed(&hash_id.to_le_bytes(), 0x6d6f_6f6e); // "moon"
    for i in 0..tokens {
        if i % 4 == 0 {
            // One 64-bit draw feeds four tokens of 15 bits each.
            state = splitmix64(state);
        }
        let bits = state >> ((i % 4) * 16);
        for shift in [0, 5, 10] {
            out.push(char::from(b'a' + ((bits >> shift) & 31) as u8 % 26));
        }
        out.push(' ');
    }
    out
}

/// Output "tokens" the simulator generates: short words that need no JSON escaping.
const WORDS: [&str; 16] = [
    " the", " kv", " is", " hot", " and", " now", " we", " go", " far", " on", " a", " new",
    " way", " to", " the", " end",
];

/// The `i`-th output token's text.
pub(crate) fn output_token(i: usize) -> &'static str {
    WORDS[i % WORDS.len()]
}

/// Text of `n` output tokens.
pub(crate) fn output_text(n: usize) -> String {
    let mut out = String::with_capacity(n * BYTES_PER_TOKEN);
    (0..n).for_each(|i| out.push_str(output_token(i)));
    out
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{block_hashes, count_tokens};

    #[test]
    fn block_text_is_deterministic_sized_and_distinct() {
        let a = block_text(7, 512);
        assert_eq!(a, block_text(7, 512));
        assert_eq!(a.len(), 512 * 4);
        assert_eq!(count_tokens(a.as_bytes()), 512);
        assert!(a.is_ascii());
        assert_ne!(a, block_text(8, 512));
        // Distinct ids share no KV block, not even the first.
        let (ha, hb) = (
            block_hashes(a.as_bytes(), 16, None),
            block_hashes(block_text(8, 512).as_bytes(), 16, None),
        );
        assert!(ha.iter().all(|h| !hb.contains(h)));
        // A shorter text is a prefix of the longer one for the same id.
        assert!(a.starts_with(&block_text(7, 100)));
    }

    #[test]
    fn output_tokens_need_no_json_escaping() {
        assert!(
            WORDS
                .iter()
                .all(|w| w.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()))
        );
        assert_eq!(output_text(3), " the kv is");
    }
}
