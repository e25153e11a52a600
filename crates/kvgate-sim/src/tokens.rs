//! Prompt bytes → tokens → chained block hashes, the way vLLM keys its prefix cache.
//!
//! The simulator does not run a real tokenizer: one token is one 4-byte chunk of
//! the prompt's bytes (roughly what BPE tokenizers average on English text), so
//! token identity is the chunk itself and a prompt of `n` bytes has ⌈n/4⌉ tokens.
//! Block `i` (tokens `16i..16i+16`) is hashed as `xxh3(parent ‖ its bytes)`, where
//! `parent` is the previous block's hash; the first block's parent is a fixed root,
//! or a hash of `cache_salt` when the request carries one, so two salts never share
//! a block. Only full blocks are hashed: a trailing partial block is never cached.
//! Cost: one pass of xxh3 over the prompt, once per request.
//!
//! With a real tokenizer, [`token_block_hashes`] keys blocks of token ids the same
//! way, over the ids' little-endian bytes, with a seed of its own: the hash is
//! the simulator's, and a gateway must never depend on it.

use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

/// Bytes of prompt text per simulated token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Parent of an unsalted prompt's first block.
const ROOT: u64 = 0x6b76_6761_7465_7369; // "kvgatesi"
/// Seed for hashing a `cache_salt` into the first block's parent.
const SALT_SEED: u64 = 0x5341_4c54; // "SALT"

/// Number of simulated tokens in `prompt`.
pub fn count_tokens(prompt: &[u8]) -> usize {
    prompt.len().div_ceil(BYTES_PER_TOKEN)
}

/// Chained hashes of the full `block_size`-token blocks of `prompt`.
pub fn block_hashes(prompt: &[u8], block_size: usize, cache_salt: Option<&str>) -> Vec<u64> {
    let block_size = block_size.max(1);
    let full = count_tokens(prompt) / block_size;
    let mut parent = cache_salt.map_or(ROOT, |salt| {
        // Mixing ROOT in keeps a salted chain from ever starting where an unsalted one does.
        xxh3_64_with_seed(salt.as_bytes(), SALT_SEED) ^ ROOT.rotate_left(1)
    });
    let mut out = Vec::with_capacity(full);
    for chunk in prompt.chunks(block_size * BYTES_PER_TOKEN).take(full) {
        let mut h = Xxh3::new();
        h.update(&parent.to_le_bytes());
        h.update(chunk);
        parent = h.digest();
        out.push(parent);
    }
    out
}

/// Seed of [`token_block_hashes`] ("kvgtoken").
const TOKEN_SEED: u64 = 0x6b76_6774_6f6b_656e;

/// Chained hashes of the full `block_size`-id blocks of a tokenized prompt: block
/// `i` is `xxh3_seeded(hash(i−1) ‖ ids as u32 LE)`, block 0 from a zero parent and,
/// when the request has a `cache_salt`, also over the salt (as vLLM mixes it into
/// the first block through its extra keys), so salts never share a block.
pub(crate) fn token_block_hashes(
    ids: &[u32],
    block_size: usize,
    cache_salt: Option<&str>,
) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut parent = 0u64;
    let mut buf = Vec::with_capacity(8 + block_size * 4);
    let mut out = Vec::with_capacity(ids.len() / block_size);
    for (i, block) in ids.chunks_exact(block_size).enumerate() {
        buf.clear();
        buf.extend_from_slice(&parent.to_le_bytes());
        buf.extend(block.iter().flat_map(|id| id.to_le_bytes()));
        if let (0, Some(salt)) = (i, cache_salt) {
            // Length-suffixed, so no salt reads as the start of another.
            buf.extend_from_slice(salt.as_bytes());
            buf.extend_from_slice(&(salt.len() as u64 + 1).to_le_bytes());
        }
        parent = xxh3_64_with_seed(&buf, TOKEN_SEED);
        out.push(parent);
    }
    out
}

/// Ids of the first `n` simulated tokens of `prompt`: each 4-byte chunk read as a
/// little-endian `u32` (a short last chunk zero-padded), the inverse of how a
/// token-id prompt becomes bytes.
pub(crate) fn chunk_ids(prompt: &[u8], n: usize) -> Vec<u32> {
    prompt
        .chunks(BYTES_PER_TOKEN)
        .take(n)
        .map(|chunk| {
            let mut word = [0u8; BYTES_PER_TOKEN];
            word[..chunk.len()].copy_from_slice(chunk);
            u32::from_le_bytes(word)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bytes_a_token_and_only_full_blocks_hashed() {
        assert_eq!(count_tokens(b""), 0);
        assert_eq!(count_tokens(b"abcde"), 2);
        let text = vec![b'x'; 64 * 3 + 10]; // 3 full 16-token blocks and a partial one
        assert_eq!(block_hashes(&text, 16, None).len(), 3);
        assert_eq!(block_hashes(&text[..60], 16, None).len(), 0, "15 tokens");
        // A short last chunk is still a token (a different one from the 4-byte chunk).
        assert_eq!(block_hashes(&text[..61], 16, None).len(), 1);
        assert_ne!(
            block_hashes(&text[..61], 16, None),
            block_hashes(&text[..64], 16, None)
        );
    }

    #[test]
    fn shared_prefix_shares_leading_hashes_and_chain_diverges_after() {
        let a: Vec<u8> = (0..640u32).map(|i| (i % 251) as u8).collect();
        let mut b = a.clone();
        b[64 * 5 + 3] ^= 1; // change a byte in block 5
        let (ha, hb) = (block_hashes(&a, 16, None), block_hashes(&b, 16, None));
        assert_eq!(ha.len(), 10);
        assert_eq!(ha[..5], hb[..5]);
        assert!(ha[5..].iter().zip(&hb[5..]).all(|(x, y)| x != y));
    }

    #[test]
    fn token_blocks_chain_over_ids_and_salt_separates_them() {
        let ids: Vec<u32> = (0..40).collect();
        let plain = token_block_hashes(&ids, 16, None);
        assert_eq!(plain.len(), 2, "only full blocks");
        assert_eq!(plain, token_block_hashes(&ids[..32], 16, None));
        let mut other = ids.clone();
        other[20] = 999;
        let changed = token_block_hashes(&other, 16, None);
        assert_eq!(changed[0], plain[0]);
        assert_ne!(changed[1], plain[1]);
        let salted = token_block_hashes(&ids, 16, Some("a"));
        assert!(salted.iter().all(|h| !plain.contains(h)));
        assert_ne!(salted, token_block_hashes(&ids, 16, Some("b")));
        assert_eq!(chunk_ids(b"\x01\0\0\0\x02", 5), vec![1, 2]);
    }

    #[test]
    fn salt_separates_every_block() {
        let text = vec![b'y'; 64 * 4];
        let plain = block_hashes(&text, 16, None);
        let s1 = block_hashes(&text, 16, Some("tenant-a"));
        let s2 = block_hashes(&text, 16, Some("tenant-b"));
        assert_eq!(s1, block_hashes(&text, 16, Some("tenant-a")));
        for (i, h) in plain.iter().enumerate() {
            assert!(!s1.contains(h) && !s2.contains(h), "block {i} shared");
        }
        assert!(s1.iter().all(|h| !s2.contains(h)));
    }
}
