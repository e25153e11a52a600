//! Deterministic filler text: prompt blocks for Mooncake trace ids and output tokens.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::tokens::BYTES_PER_TOKEN;

/// Three-letter English words, each one token of BPE tokenizers trained on
/// English (SmolLM2's, GPT-2's, Llama 3's) when preceded by a space: text made
/// of them tokenizes at one real token per 4-byte simulated token (measured
/// 1.000 with SmolLM2's tokenizer), so a simulator running a real tokenizer
/// (`kv_aware`) and one counting 4-byte chunks see the same prompt lengths.
const FILLER: [&str; 256] = [
    "the", "and", "for", "you", "are", "not", "but", "can", "all", "was", "one", "out", "new",
    "has", "how", "its", "now", "our", "two", "way", "who", "any", "day", "get", "may", "see",
    "use", "man", "old", "big", "end", "far", "few", "got", "let", "put", "say", "set", "top",
    "try", "yes", "yet", "air", "art", "bad", "bed", "box", "boy", "car", "cut", "dog", "eat",
    "eye", "fun", "hot", "job", "key", "law", "low", "map", "mix", "net", "oil", "pay", "per",
    "red", "run", "sea", "sit", "sun", "tax", "ten", "war", "win", "age", "ago", "add", "aid",
    "arm", "ask", "bag", "bar", "bit", "bus", "buy", "cat", "cup", "die", "dry", "due", "egg",
    "fan", "fat", "fit", "fix", "fly", "gas", "god", "gun", "guy", "hat", "hit", "ice", "ill",
    "kid", "lab", "lay", "leg", "lie", "lot", "mom", "mud", "nor", "odd", "off", "own", "pen",
    "pet", "pie", "pop", "pot", "raw", "row", "sad", "sky", "son", "sum", "tea", "tie", "tip",
    "toe", "van", "web", "wet", "why", "ace", "act", "ant", "ape", "apt", "arc", "ash", "awe",
    "axe", "bat", "bay", "bee", "beg", "bet", "bid", "bin", "bow", "bud", "bug", "cab", "cap",
    "cow", "cry", "cub", "dad", "dam", "den", "dew", "dig", "dim", "dip", "dot", "dug", "ear",
    "elm", "era", "eve", "fee", "fig", "fin", "fir", "fog", "foe", "fox", "fur", "gap", "gel",
    "gem", "gin", "gum", "gut", "hen", "hid", "him", "hip", "hog", "hop", "hub", "hug", "hum",
    "hut", "ink", "inn", "ion", "ivy", "jam", "jar", "jaw", "jet", "jog", "joy", "jug", "kin",
    "kit", "lad", "lap", "led", "lid", "lip", "log", "mad", "mat", "men", "met", "nap", "nod",
    "nun", "nut", "oak", "oat", "opt", "orb", "ore", "owl", "pad", "pal", "pan", "paw", "pea",
    "peg", "pin", "pit", "ply", "pod", "pro", "pub", "pun", "pup", "rag", "ram", "rap", "rat",
    "ray", "rib", "rid", "rig", "rim", "rip", "rob", "rod", "rot",
];

/// Deterministic text for a Mooncake trace block id: `tokens` simulated tokens
/// (`4 × tokens` ASCII bytes: a three-letter word and a space each).
///
/// The same id always gives the same text and different ids give different text
/// (8 bits of a hash stream per token: a 16-token block is one of 2^128), so a
/// request built by concatenating the texts of its `hash_ids` shares exactly
/// the trace's reusable prefix with other requests. Mooncake blocks are 512
/// tokens, a multiple of the simulator's 16-token KV block.
pub fn block_text(hash_id: u64, tokens: usize) -> String {
    let mut out = String::with_capacity(tokens * BYTES_PER_TOKEN);
    let mut state = xxh3_64_with_seed(&hash_id.to_le_bytes(), 0x6d6f_6f6e); // "moon"
    for i in 0..tokens {
        if i % 8 == 0 {
            // One 64-bit draw feeds eight tokens of 8 bits each.
            state = splitmix64(state);
        }
        let word = FILLER[((state >> ((i % 8) * 8)) & 0xff) as usize];
        out.push_str(word);
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

    /// A real tokenizer sees as many tokens as the simulator counts, so runs
    /// with and without one compare the same workload.
    #[test]
    fn filler_is_one_real_token_per_simulated_token() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/smollm2/tokenizer.json"
        );
        let tok =
            kvgate_tokenize::PromptTokenizer::load(path, None).unwrap_or_else(|e| panic!("{e}"));
        for id in [1u64, 99, 123_456] {
            let text = block_text(id, 4096);
            let ratio = tok.encode(&text, false).len() as f64 / 4096.0;
            assert!(
                (0.97..=1.03).contains(&ratio),
                "id {id}: {ratio} tokens per simulated token"
            );
        }
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
