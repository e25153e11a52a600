//! Prompt bytes → tokens → chained block hashes, the way vLLM keys its prefix cache.
//!
//! The simulator does not run a real tokenizer: a token is a run of the
//! prompt's bytes, [`BYTES_PER_TOKEN`] (4, roughly what BPE tokenizers average
//! on English text) unless the instance is configured with another density
//! ([`TokenBytes`], `SimConfig::bytes_per_token`: about 2 for code, about 3.9
//! for CJK text at 1.3 characters a token). Token identity is the run of bytes
//! itself, so a prompt of `n` bytes has ⌈n/b⌉ tokens at `b` bytes a token.
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

/// Bytes of prompt text per simulated token, by default.
pub const BYTES_PER_TOKEN: usize = 4;

/// Parent of an unsalted prompt's first block.
const ROOT: u64 = 0x6b76_6761_7465_7369; // "kvgatesi"
/// Seed for hashing a `cache_salt` into the first block's parent.
const SALT_SEED: u64 = 0x5341_4c54; // "SALT"

/// Thousandths of a byte: the unit a density is held in.
const MILLI: u64 = 1_000;
/// Most bytes a token: beyond this no text is a tokenizer's.
pub const MAX_BYTES_PER_TOKEN: f64 = 64.0;

/// How many prompt bytes make a simulated token: a fixed-point number of
/// thousandths of a byte, so fractional densities (3.9 bytes a token: CJK
/// text at 1.3 characters a token, 3 bytes a character) work without
/// rounding 1.3 away, and token `k` starts at byte ⌊k·b⌋ computed in integers:
/// the same bytes are the same tokens on every instance and every run, where
/// accumulated floating-point steps could drift a boundary by a byte. At 4
/// (the default) token `k` is bytes `4k..4k+4`, exactly the old model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBytes {
    milli: u64,
}

impl Default for TokenBytes {
    fn default() -> Self {
        Self {
            milli: BYTES_PER_TOKEN as u64 * MILLI,
        }
    }
}

impl TokenBytes {
    /// `bytes_per_token` clamped to `1..=64` (to the nearest thousandth);
    /// anything not a finite number is the default 4.
    pub fn new(bytes_per_token: f64) -> Self {
        if !bytes_per_token.is_finite() {
            return Self::default();
        }
        let b = bytes_per_token.clamp(1.0, MAX_BYTES_PER_TOKEN);
        Self {
            // In 1_000..=64_000 after the clamp: `as` cannot truncate.
            milli: (b * MILLI as f64).round() as u64,
        }
    }

    /// Bytes a token, as a number.
    pub fn get(self) -> f64 {
        self.milli as f64 / MILLI as f64
    }

    /// First byte of token `k`: ⌊k·b⌋.
    fn start(self, k: usize) -> usize {
        let at = (k as u128 * u128::from(self.milli)) / u128::from(MILLI);
        usize::try_from(at).unwrap_or(usize::MAX)
    }

    /// Number of simulated tokens in `prompt`: ⌈len/b⌉.
    pub fn count(self, prompt: &[u8]) -> usize {
        let n = (prompt.len() as u128 * u128::from(MILLI)).div_ceil(u128::from(self.milli));
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// Bytes of tokens `from..to` of `prompt` (cut at its end).
    fn span(self, prompt: &[u8], from: usize, to: usize) -> &[u8] {
        let end = self.start(to).min(prompt.len());
        prompt
            .get(self.start(from).min(end)..end)
            .unwrap_or_default()
    }

    /// Chained hashes of the full `block_size`-token blocks of `prompt`.
    pub fn block_hashes(
        self,
        prompt: &[u8],
        block_size: usize,
        cache_salt: Option<&str>,
    ) -> Vec<u64> {
        let block_size = block_size.max(1);
        let full = self.count(prompt) / block_size;
        let mut parent = cache_salt.map_or(ROOT, |salt| {
            // Mixing ROOT in keeps a salted chain from ever starting where an unsalted one does.
            xxh3_64_with_seed(salt.as_bytes(), SALT_SEED) ^ ROOT.rotate_left(1)
        });
        let mut out = Vec::with_capacity(full);
        for i in 0..full {
            let mut h = Xxh3::new();
            h.update(&parent.to_le_bytes());
            h.update(self.span(prompt, i * block_size, (i + 1) * block_size));
            parent = h.digest();
            out.push(parent);
        }
        out
    }

    /// Ids of the first `n` simulated tokens of `prompt`: a token of at most
    /// 4 bytes read as a little-endian `u32` (a short one zero-padded), the
    /// inverse of how a token-id prompt becomes bytes; a longer one (beyond 4
    /// bytes a token) its bytes' hash, cut to 32 bits.
    pub(crate) fn chunk_ids(self, prompt: &[u8], n: usize) -> Vec<u32> {
        let n = n.min(self.count(prompt));
        (0..n)
            .map(|k| {
                let chunk = self.span(prompt, k, k + 1);
                let mut word = [0u8; 4];
                match word.get_mut(..chunk.len()) {
                    Some(w) => {
                        w.copy_from_slice(chunk);
                        u32::from_le_bytes(word)
                    }
                    None => xxh3_64_with_seed(chunk, 0) as u32,
                }
            })
            .collect()
    }
}

/// Number of simulated tokens in `prompt`, at 4 bytes a token.
pub fn count_tokens(prompt: &[u8]) -> usize {
    TokenBytes::default().count(prompt)
}

/// Chained hashes of the full `block_size`-token blocks of `prompt`, at 4 bytes a token.
pub fn block_hashes(prompt: &[u8], block_size: usize, cache_salt: Option<&str>) -> Vec<u64> {
    TokenBytes::default().block_hashes(prompt, block_size, cache_salt)
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
        assert_eq!(
            TokenBytes::default().chunk_ids(b"\x01\0\0\0\x02", 5),
            vec![1, 2]
        );
    }

    #[test]
    fn two_bytes_a_token_doubles_tokens_and_blocks() {
        let text = vec![b'z'; 64 * 3 + 10];
        let (four, two) = (TokenBytes::new(4.0), TokenBytes::new(2.0));
        assert_eq!(four, TokenBytes::default());
        assert_eq!(four.count(&text), 51);
        assert_eq!(two.count(&text), 101);
        assert_eq!(four.block_hashes(&text, 16, None).len(), 3);
        assert_eq!(two.block_hashes(&text, 16, None).len(), 6);
        // A block is 32 bytes at 2 bytes a token: the chain is over 32-byte runs.
        let varied: Vec<u8> = (0..320u32).map(|i| (i % 251) as u8).collect();
        let mut b = varied.clone();
        b[32 * 3 + 1] ^= 1;
        let (ha, hb) = (
            two.block_hashes(&varied, 16, None),
            two.block_hashes(&b, 16, None),
        );
        assert_eq!(ha.len(), 10);
        assert_eq!(ha[..3], hb[..3]);
        assert_ne!(ha[3], hb[3]);
        assert_eq!(two.chunk_ids(b"\x01\0\x02\0", 9), vec![1, 2]);
    }

    #[test]
    fn fractional_densities_cut_tokens_at_the_floor_of_k_times_b() {
        // CJK at 1.3 characters a token: 3.9 bytes a token.
        let cjk = TokenBytes::new(3.9);
        assert_eq!(cjk.get(), 3.9);
        assert_eq!(cjk.count(&[0; 39]), 10);
        assert_eq!(cjk.count(&[0; 40]), 11);
        assert_eq!((cjk.start(1), cjk.start(2), cjk.start(10)), (3, 7, 39));
        let text: Vec<u8> = (0..2_000u32).map(|i| (i % 253) as u8).collect();
        let blocks = cjk.block_hashes(&text, 16, None);
        assert_eq!(blocks.len(), cjk.count(&text) / 16);
        assert_eq!(blocks[..5], cjk.block_hashes(&text[..400], 16, None)[..5]);
        // Over 4 bytes a token an id is the token's hash; still one a token.
        let wide = TokenBytes::new(6.5);
        assert_eq!(wide.chunk_ids(&text, 1_000).len(), wide.count(&text));
    }

    #[test]
    fn unusable_densities_are_clamped_or_the_default() {
        assert_eq!(TokenBytes::new(f64::NAN), TokenBytes::default());
        assert_eq!(TokenBytes::new(f64::INFINITY), TokenBytes::default());
        assert_eq!(TokenBytes::new(0.0).get(), 1.0);
        assert_eq!(TokenBytes::new(-3.0).get(), 1.0);
        assert_eq!(TokenBytes::new(1e9).get(), MAX_BYTES_PER_TOKEN);
        assert_eq!(TokenBytes::new(1.0).count(b"abc"), 3);
        assert_eq!(TokenBytes::new(1.0).count(b""), 0);
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
