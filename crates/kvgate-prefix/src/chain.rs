//! The block chain of a prompt: its canonical window cut into fixed blocks,
//! each hashed on its parent's hash, the first seeded by tenant and partition.
//!
//! Two prompts share the first `d` chain hashes exactly when they share the
//! first `d` blocks of text under the same tenant and partition, so "how much
//! of this prompt does an instance hold" becomes "how many of its chain hashes
//! has the instance seen". Chained seeding makes every hash name its whole
//! prefix, as vLLM's block hashes do, so an index needs no tree.
//!
//! Blocks are `block_bytes` bytes of the UTF-8 window (characters, for ASCII
//! text); a block's end moves forward to the next character boundary so no
//! character is split. Only full blocks are hashed: a partial tail is what the
//! next turn of a conversation extends, so it would never match again. Work is
//! O(window) and one xxh3 pass; nothing is allocated but the output.

use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

/// Chain hashes of the first `max_blocks` full blocks of `window`.
pub fn block_chain(
    tenant: &str,
    partition: &str,
    window: &[u8],
    block_bytes: usize,
    max_blocks: usize,
) -> Vec<u64> {
    let block = block_bytes.max(1);
    let mut chain = Vec::with_capacity((window.len() / block).min(max_blocks));
    let mut parent = chain_seed(tenant, partition);
    let mut start = 0;
    while chain.len() < max_blocks {
        let mut end = start + block;
        if end > window.len() {
            break;
        }
        // UTF-8 continuation bytes are 0b10xx_xxxx: step past them.
        while end < window.len() && window[end] & 0xC0 == 0x80 {
            end += 1;
        }
        parent = xxh3_64_with_seed(&window[start..end], parent);
        chain.push(parent);
        start = end;
    }
    chain
}

/// The seed of a chain: `xxh3_64("chain" ‖ 0 ‖ tenant ‖ 0 ‖ partition)`. The
/// domain tag keeps it apart from routing keys; NUL separators keep it
/// injective (tenants and partitions hold no NUL).
fn chain_seed(tenant: &str, partition: &str) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"chain\0");
    h.update(tenant.as_bytes());
    h.update(&[0]);
    h.update(partition.as_bytes());
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_shares_exactly_its_full_blocks() {
        let a = "x".repeat(1000);
        let b = format!("{}{}", "x".repeat(600), "y".repeat(400));
        let ca = block_chain("t", "", a.as_bytes(), 256, 100);
        let cb = block_chain("t", "", b.as_bytes(), 256, 100);
        assert_eq!((ca.len(), cb.len()), (3, 3));
        assert_eq!(ca[..2], cb[..2]);
        assert_ne!(ca[2], cb[2]);
    }

    #[test]
    fn tenant_and_partition_separate_chains() {
        let w = "same prompt ".repeat(100);
        let base = block_chain("t", "p", w.as_bytes(), 64, 100);
        assert!(!base.is_empty());
        for other in [
            block_chain("u", "p", w.as_bytes(), 64, 100),
            block_chain("t", "q", w.as_bytes(), 64, 100),
            block_chain("tp", "", w.as_bytes(), 64, 100),
        ] {
            assert!(other.iter().all(|h| !base.contains(h)));
        }
    }

    #[test]
    fn caps_blocks_and_never_splits_a_character() {
        let w = "é".repeat(500); // 2 bytes each
        let c = block_chain("", "", w.as_bytes(), 3, 10);
        assert_eq!(c.len(), 10);
        // Blocks of 3 bytes round up to 4 (two whole characters).
        assert_eq!(c, block_chain("", "", "é".repeat(20).as_bytes(), 3, 10));
        assert!(block_chain("", "", b"short", 256, 10).is_empty());
        assert!(block_chain("", "", w.as_bytes(), 0, 0).is_empty());
    }
}
