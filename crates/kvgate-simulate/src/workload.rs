//! A trace turned into what the simulated fleet sees: each request's chained
//! KV-block hashes (blocks of `block_size` tokens: 16 as in kvgate-sim, or the
//! trace's 512), its routing key for a given `prefix_length`, and the
//! token-level hit-rate ceiling.
//!
//! **Blocks.** Trace block `i` (tokens `512i..512i+512`) gets the chained hash
//! `c_i = xxh3(id_i; seed c_{i−1})`, so equal chains mean equal text up to there,
//! as with vLLM's chained block hashes. The KV block `b` (tokens `sb..sb+s`,
//! `s = block_size`) is keyed by the chain of the trace block holding its last
//! token and by `b`, so two requests share it exactly when their first `s(b+1)`
//! tokens are equal. Tokens past the ids a line lists are unique to that
//! request. Only full blocks are hashed, as in kvgate-sim.
//!
//! **Routing window.** The gateway hashes the first `prefix_length` characters of
//! the prompt; kvgate-sim counts 4 characters a token (`BYTES_PER_TOKEN`), so the
//! window is `w = min(⌈prefix_length/4⌉, input_length)` tokens. Those tokens are
//! fixed by the ids of the trace blocks they touch plus `w` itself (a shorter
//! prompt's window is the whole prompt), so the window bytes fed to
//! `kvgate_prefix::routing_key` are those ids and `w`, little-endian: equal
//! exactly when the text windows would be equal (tested against
//! `kvgate_sim::block_text`), at a fraction of the cost.

use std::collections::HashSet;

use kvgate_sim::BYTES_PER_TOKEN;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::trace::{TRACE_BLOCK_TOKENS, TraceRequest, ratio};

/// The tenant every request of a trace belongs to (authentication off).
pub const TENANT: &str = "anonymous";

/// Parent of the first trace block's chain.
const ROOT: u64 = 0x6b76_6761_7465_7369;
/// Seed for tokens beyond a line's `hash_ids`: unique to the request.
const UNIQUE_SEED: u64 = 0x756e_6971_7565;

/// One request as the fleet sees it.
#[derive(Debug, Clone)]
pub struct SimRequest {
    /// Arrival in seconds from the trace's start, before any speed-up.
    pub arrival_s: f64,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    hashes: std::ops::Range<usize>,
}

/// The requests of a trace with their block hashes, in arrival order.
#[derive(Debug)]
pub struct Workload {
    pub requests: Vec<SimRequest>,
    pub block_size: usize,
    hashes: Vec<u64>,
}

impl Workload {
    /// Hash every request's full `block_size`-token blocks. Costs one xxh3 of
    /// 8 bytes per block and keeps them all (8 bytes a block) for every run.
    pub fn new(trace: &[TraceRequest], block_size: usize) -> Self {
        let block_size = block_size.max(1);
        let mut hashes = Vec::new();
        let mut chain = Vec::new();
        let requests = trace
            .iter()
            .enumerate()
            .map(|(n, req)| {
                // kvgate-sim clamps both to at least one token.
                let prompt_tokens = req.input_length.max(1);
                chain.clear();
                let mut parent = ROOT;
                for &id in &req.hash_ids {
                    parent = xxh3_64_with_seed(&id.to_le_bytes(), parent);
                    chain.push(parent);
                }
                let unique = xxh3_64_with_seed(&(n as u64).to_le_bytes(), UNIQUE_SEED);
                let start = hashes.len();
                for b in 0..prompt_tokens / block_size {
                    let last_token = (b + 1) * block_size - 1;
                    let seed = chain
                        .get(last_token / TRACE_BLOCK_TOKENS)
                        .copied()
                        .unwrap_or(unique);
                    hashes.push(xxh3_64_with_seed(&(b as u64).to_le_bytes(), seed));
                }
                SimRequest {
                    arrival_s: req.timestamp / 1000.0,
                    prompt_tokens,
                    output_tokens: req.output_length.max(1),
                    hashes: start..hashes.len(),
                }
            })
            .collect();
        Self {
            requests,
            block_size,
            hashes,
        }
    }

    /// Chained hashes of request `i`'s full prompt blocks.
    pub fn hashes(&self, i: usize) -> &[u64] {
        self.requests
            .get(i)
            .and_then(|r| self.hashes.get(r.hashes.clone()))
            .unwrap_or_default()
    }

    /// Most leading blocks a request may hit: vLLM recomputes at least the last
    /// prompt token to get its logits (kvgate-sim's cap).
    pub fn max_hit(&self, i: usize) -> usize {
        self.requests
            .get(i)
            .map_or(0, |r| (r.prompt_tokens - 1) / self.block_size)
    }

    /// Share of prompt tokens an infinite cache, shared by all and warm the
    /// moment a block is seen, would serve: the same measure as the simulated
    /// hit rate, so the simulated hit rate over this is "fraction of ceiling".
    pub fn token_ceiling(&self) -> f64 {
        let mut seen: HashSet<u64, kvgate_sim::BlockHashBuilder> = HashSet::default();
        let (mut hit, mut total) = (0usize, 0usize);
        for (i, req) in self.requests.iter().enumerate() {
            let hashes = self.hashes(i);
            let lead = hashes
                .iter()
                .take(self.max_hit(i))
                .take_while(|h| seen.contains(h))
                .count();
            hit += lead * self.block_size;
            total += req.prompt_tokens;
            seen.extend(hashes.iter().copied());
        }
        ratio(hit, total)
    }
}

/// Routing key of every request for a window of `prefix_length` characters.
pub fn routing_keys(trace: &[TraceRequest], prefix_length: usize) -> Vec<u64> {
    let mut window = Vec::new();
    trace
        .iter()
        .map(|req| {
            window_bytes(req, prefix_length, &mut window);
            kvgate_prefix::routing_key(TENANT, "", &window)
        })
        .collect()
}

/// The stand-in for the first `prefix_length` characters of the prompt text.
fn window_bytes(req: &TraceRequest, prefix_length: usize, out: &mut Vec<u8>) {
    out.clear();
    let tokens = prefix_length
        .div_ceil(BYTES_PER_TOKEN)
        .min(req.input_length.max(1));
    let blocks = tokens.div_ceil(TRACE_BLOCK_TOKENS);
    for id in req.hash_ids.iter().take(blocks) {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(&(tokens as u64).to_le_bytes());
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

    #[test]
    fn shared_trace_blocks_share_kv_blocks_and_diverge_after() {
        let t = [req(&[1, 2], 1000), req(&[1, 3], 1024), req(&[5], 40)];
        let w = Workload::new(&t, 16);
        let (a, b) = (w.hashes(0), w.hashes(1));
        assert_eq!((a.len(), b.len(), w.hashes(2).len()), (62, 64, 2));
        assert_eq!(a[..32], b[..32]);
        assert!(a[32..].iter().all(|h| !b.contains(h)));
        assert_eq!(w.max_hit(1), 63, "the last token is always recomputed");
    }

    #[test]
    fn token_ceiling_by_hand() {
        // 1024 tokens cold; then the same first block (32 blocks = 512 tokens) of
        // 1024; then an exact repeat of the first, capped at 63 of its 64 blocks.
        let t = [req(&[1, 2], 1024), req(&[1, 3], 1024), req(&[1, 2], 1024)];
        let w = Workload::new(&t, 16);
        let expected = (512.0 + 63.0 * 16.0) / 3072.0;
        assert!((w.token_ceiling() - expected).abs() < 1e-12);
    }

    #[test]
    fn cheap_window_partitions_requests_like_the_text_window() {
        let text = |r: &TraceRequest| -> String {
            let mut s = String::new();
            for (i, &id) in r.hash_ids.iter().enumerate() {
                let left = r.input_length - i * TRACE_BLOCK_TOKENS;
                s.push_str(&kvgate_sim::block_text(id, left.min(TRACE_BLOCK_TOKENS)));
            }
            s
        };
        let reqs = [
            req(&[1], 300),
            req(&[1], 400),
            req(&[1, 2], 600),
            req(&[1, 2, 3], 1500),
            req(&[1, 4, 3], 1500),
            req(&[7, 2], 1024),
        ];
        for prefix_length in [1024, 1200, 2048, 4096, 8192] {
            let keys = routing_keys(&reqs, prefix_length);
            for (i, a) in reqs.iter().enumerate() {
                for (j, b) in reqs.iter().enumerate() {
                    let (ta, tb) = (text(a), text(b));
                    let wa = &ta[..prefix_length.min(ta.len())];
                    let wb = &tb[..prefix_length.min(tb.len())];
                    assert_eq!(keys[i] == keys[j], wa == wb, "{prefix_length}: {i} vs {j}");
                }
            }
        }
    }
}
