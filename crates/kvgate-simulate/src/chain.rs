//! The block chain the live gateway would cut from each trace request
//! (`kvgate_prefix::block_chain`, used by `longest_prefix`): what the gateway's
//! per-instance [`BlockIndex`](kvgate_routing::BlockIndex) is filled from and
//! looked up with.
//!
//! The gateway sees the prompt as text: `input_length` tokens at 4 characters a
//! token (kvgate-sim's `BYTES_PER_TOKEN`, the cost model's `CHARS_PER_TOKEN`),
//! cut into blocks of `block_chars` characters, only full blocks, at most
//! `max_prompt_blocks` of them. Trace block `t` is characters `2048t..2048t+2048`
//! of that text, fixed by its id (a shorter last block is a prefix of the full
//! one, as in `kvgate_sim::block_text`). Chain block `j` (characters
//! `jB..jB+B`) is therefore fixed by the ids of the trace blocks it touches and
//! by `j`; its hash is `xxh3(those ids ‖ j; seed = hash of block j−1)`, the
//! first seeded by the tenant, so two requests share the first `d` hashes
//! exactly when the gateway's text chains would (tested against the real
//! `block_chain` over `block_text`). With `B` dividing 2048 a block touches one
//! trace block and the hash is `xxh3(id ‖ j; parent)`; other sizes need no
//! rounding. Characters past the ids a line lists are unique to the request.

use std::ops::Range;

use kvgate_sim::BYTES_PER_TOKEN;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::trace::{TRACE_BLOCK_TOKENS, TraceRequest};
use super::workload::TENANT;

/// Characters of prompt text per trace block.
const TRACE_BLOCK_CHARS: usize = TRACE_BLOCK_TOKENS * BYTES_PER_TOKEN;
/// Stands in for the ids of trace blocks beyond a line's `hash_ids`.
const UNIQUE_SEED: u64 = 0x6761_7465_7761_7921;

/// Every request's gateway-side chain for one block size, in trace order.
#[derive(Debug)]
pub struct Chains {
    pub block_chars: usize,
    hashes: Vec<u64>,
    ranges: Vec<Range<usize>>,
}

impl Chains {
    /// Cut every request of `trace` into blocks of `block_chars` characters,
    /// at most `max_blocks` a request. One xxh3 of a few words per block.
    pub fn new(trace: &[TraceRequest], block_chars: usize, max_blocks: usize) -> Self {
        let block = block_chars.max(1);
        let root = xxh3_64_with_seed(TENANT.as_bytes(), 0x6368_6169_6e00);
        let mut hashes = Vec::new();
        let mut bytes = Vec::with_capacity(64);
        let ranges = trace
            .iter()
            .enumerate()
            .map(|(n, req)| {
                let chars = req.input_length.max(1) * BYTES_PER_TOKEN;
                let blocks = (chars / block).min(max_blocks);
                let unique = xxh3_64_with_seed(&(n as u64).to_le_bytes(), UNIQUE_SEED);
                let start = hashes.len();
                let mut parent = root;
                for j in 0..blocks {
                    bytes.clear();
                    let (first, last) = (j * block, (j + 1) * block - 1);
                    for t in first / TRACE_BLOCK_CHARS..=last / TRACE_BLOCK_CHARS {
                        let id = req.hash_ids.get(t).copied().unwrap_or(unique);
                        bytes.extend_from_slice(&id.to_le_bytes());
                    }
                    bytes.extend_from_slice(&(j as u64).to_le_bytes());
                    parent = xxh3_64_with_seed(&bytes, parent);
                    hashes.push(parent);
                }
                start..hashes.len()
            })
            .collect();
        Self {
            block_chars: block,
            hashes,
            ranges,
        }
    }

    /// Request `i`'s chain (empty for an unknown request).
    pub fn chain(&self, i: usize) -> &[u64] {
        self.ranges
            .get(i)
            .and_then(|r| self.hashes.get(r.clone()))
            .unwrap_or_default()
    }

    /// Blocks over all requests.
    pub fn total_blocks(&self) -> usize {
        self.hashes.len()
    }
}

/// Blocks the gateway's index holds for an instance of `cache_tokens` tokens:
/// `RoutingConfig::index_blocks` (one block stands for `block_chars / 4` tokens).
pub fn index_blocks(cache_tokens: usize, block_chars: usize) -> usize {
    let block_tokens = kvgate_routing::cost::block_tokens(block_chars);
    (cache_tokens / block_tokens).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64], input: usize) -> TraceRequest {
        TraceRequest {
            timestamp: 0.0,
            input_length: input,
            output_length: 1,
            hash_ids: ids.to_vec(),
        }
    }

    /// The prompt text kvgate-sim would send for a trace line.
    fn text(r: &TraceRequest) -> String {
        let mut s = String::new();
        for (i, &id) in r.hash_ids.iter().enumerate() {
            let left = r.input_length.saturating_sub(i * TRACE_BLOCK_TOKENS);
            s.push_str(&kvgate_sim::block_text(id, left.min(TRACE_BLOCK_TOKENS)));
        }
        s
    }

    #[test]
    fn chains_share_prefixes_exactly_as_the_text_chains_do() {
        let reqs = [
            req(&[1], 300),
            req(&[1], 400),
            req(&[1, 2], 600),
            req(&[1, 2], 1024),
            req(&[1, 2, 3], 1500),
            req(&[1, 4, 3], 1500),
            req(&[7, 2], 1024),
        ];
        for (block_chars, max_blocks) in
            [(128, 1024), (256, 1024), (2048, 1024), (768, 3), (1000, 9)]
        {
            let cheap = Chains::new(&reqs, block_chars, max_blocks);
            let real: Vec<Vec<u64>> = reqs
                .iter()
                .map(|r| {
                    kvgate_prefix::block_chain(
                        TENANT,
                        "",
                        text(r).as_bytes(),
                        block_chars,
                        max_blocks,
                    )
                })
                .collect();
            for (i, ri) in real.iter().enumerate() {
                assert_eq!(cheap.chain(i).len(), ri.len(), "{block_chars}: {i}");
                for (j, rj) in real.iter().enumerate() {
                    for d in 1..=ri.len().min(rj.len()) {
                        assert_eq!(
                            cheap.chain(i)[..d] == cheap.chain(j)[..d],
                            ri[..d] == rj[..d],
                            "{block_chars}: {i} vs {j} at depth {d}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn tokens_past_the_ids_are_unique_and_the_cap_holds() {
        // 1,024 tokens but one listed block: the second half is the request's own.
        let c = Chains::new(&[req(&[1], 1024), req(&[1], 1024)], 512, 1024);
        assert_eq!((c.chain(0).len(), c.total_blocks()), (8, 16));
        assert_eq!(c.chain(0)[..4], c.chain(1)[..4]);
        assert!(c.chain(0)[4..].iter().all(|h| !c.chain(1).contains(h)));
        assert_eq!(Chains::new(&[req(&[1], 1024)], 16, 10).chain(0).len(), 10);
        assert!(c.chain(5).is_empty());
        assert_eq!(index_blocks(384_000, 256), 6_000);
        assert_eq!(index_blocks(10, 1024), 1);
    }
}
