//! The cost model of cache-aware routing: the estimated time, in prefill
//! tokens, until this request's first token on each instance.
//!
//! ```text
//! cost(i) = uncached(i)                     this prompt's own prefill on i
//!         + queued_prefill(i)               prefill still waiting on i: Σ over its
//!                                           requests without a first byte yet of
//!                                           (uncached tokens + REQUEST_OVERHEAD)
//!         + RUNNING_WEIGHT × in_flight(i)   decode work sharing i's steps
//! uncached(i) = prompt_tokens − min(prompt_tokens, matched_blocks(i) × block_tokens)
//! ```
//!
//! Why this shape (after Dynamo's "prefill blocks to compute + decode blocks",
//! llm-d's queued-prefill scorer, Preble's E2 and LMetric): time to first token
//! on an instance is the prefill queued ahead of the request plus its own
//! uncached prefill, both at the instance's prefill rate, so the two are added
//! in the same unit and no rate needs configuring. A conversation's next turn
//! therefore stays where its history is cached until that instance's queue is
//! longer than the history would take to recompute elsewhere; a hot prefix
//! spills onto a second instance when waiting costs more than a cold prefill
//! there — and that instance then holds it too; a cold prefix costs the same
//! everywhere but for load, and goes to the least-loaded instance. The cost
//! compares only this request's wait, though: a shared system prompt's holder
//! stays cheaper for every new conversation long after it is overloaded, so the
//! policy also caps load (see `longest.rs`), and that cap is what replicates
//! such prefixes.
//!
//! Known approximation: the queued charge is given back at the response's first
//! body byte. For a stream that is the first token; a non-streaming answer
//! (the native Invoke default) sends its first byte at the end, so its charge
//! also covers its decoding and such instances look busier than they are.
//!
//! The constants, in prefill tokens:
//! - [`REQUEST_OVERHEAD`] 256: every queued request costs at least one engine
//!   step whatever its size (≈ 25 ms × 12k tokens/s on a 70B model, ≈ 10 ms ×
//!   25k tokens/s on an 8B): without it a queue of fully cached requests would
//!   look free and a hot prefix would never spread.
//! - [`RUNNING_WEIGHT`] 32: a decoding request slows every step a little (its KV
//!   is read each step) and holds KV space; small beside any real prefill, but
//!   enough that among otherwise equal instances the less busy one wins, which
//!   is what keeps shares even.
//! - [`CHARS_PER_TOKEN`] 4: the usual English BPE ratio, to turn the canonical
//!   prompt's characters into tokens without tokenizing on the request path.

/// Characters of canonical prompt per token, for estimates.
pub const CHARS_PER_TOKEN: usize = 4;
/// Prefill tokens every queued request is charged on top of its own.
pub const REQUEST_OVERHEAD: u64 = 256;
/// Prefill tokens charged per request in flight on an instance.
pub const RUNNING_WEIGHT: u64 = 32;

/// The model's one setting: how many tokens a matched block stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostModel {
    pub block_tokens: u64,
}

/// One instance's figures for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    /// Prompt tokens the instance holds already (estimated).
    pub cached_tokens: u64,
    /// Prompt tokens it would have to prefill.
    pub uncached_tokens: u64,
    /// Prefill already waiting there, plus the decode charge of its in-flight requests.
    pub queued_tokens: u64,
    /// `uncached_tokens + queued_tokens`: the estimated wait, in prefill tokens.
    pub total: u64,
}

impl CostModel {
    /// A model for blocks of `block_chars` characters.
    pub fn for_block_chars(block_chars: usize) -> Self {
        Self {
            block_tokens: block_tokens(block_chars) as u64,
        }
    }

    /// The cost of a `prompt_tokens` prompt on an instance holding its first
    /// `matched_blocks` blocks, with `queued_prefill` tokens waiting and
    /// `in_flight` requests running.
    pub fn cost(
        &self,
        prompt_tokens: u64,
        matched_blocks: usize,
        queued_prefill: u64,
        in_flight: usize,
    ) -> Cost {
        let cached = (matched_blocks as u64)
            .saturating_mul(self.block_tokens)
            .min(prompt_tokens);
        let uncached = prompt_tokens - cached;
        let queued = queued_prefill.saturating_add(RUNNING_WEIGHT.saturating_mul(in_flight as u64));
        Cost {
            cached_tokens: cached,
            uncached_tokens: uncached,
            queued_tokens: queued,
            total: uncached.saturating_add(queued),
        }
    }

    /// What a request adds to its instance's queued prefill until its first byte.
    pub fn queued_charge(&self, prompt_tokens: u64, matched_blocks: usize) -> u64 {
        self.cost(prompt_tokens, matched_blocks, 0, 0)
            .uncached_tokens
            .saturating_add(REQUEST_OVERHEAD)
    }
}

/// Tokens one index block of `block_chars` characters stands for (at least 1).
pub fn block_tokens(block_chars: usize) -> usize {
    (block_chars / CHARS_PER_TOKEN).max(1)
}

/// Estimated prompt tokens from characters of canonical prompt.
pub fn tokens_of_chars(chars: usize) -> u64 {
    chars.div_ceil(CHARS_PER_TOKEN) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_blocks_cut_the_prompt_cost_and_queues_add_to_it() {
        let m = CostModel::for_block_chars(256);
        assert_eq!(m.block_tokens, 64);
        let cold = m.cost(1000, 0, 0, 0);
        let warm = m.cost(1000, 10, 0, 0);
        assert_eq!(
            (cold.total, warm.cached_tokens, warm.total),
            (1000, 640, 360)
        );
        // More cached blocks than the prompt has tokens: capped, never negative.
        assert_eq!(m.cost(100, 10, 0, 0).total, 0);
        let busy = m.cost(1000, 10, 500, 2);
        assert_eq!(busy.queued_tokens, 500 + 2 * RUNNING_WEIGHT);
        assert_eq!(busy.total, 360 + 500 + 2 * RUNNING_WEIGHT);
    }

    #[test]
    fn a_queued_request_costs_at_least_the_overhead() {
        let m = CostModel::for_block_chars(256);
        assert_eq!(m.queued_charge(640, 10), REQUEST_OVERHEAD);
        assert_eq!(m.queued_charge(1000, 0), 1000 + REQUEST_OVERHEAD);
    }
}
