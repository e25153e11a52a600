//! The cost model of cache-aware routing: what sending this request to each
//! instance costs, in prefill tokens — its own wait there, plus the work the
//! choice makes for everyone else.
//!
//! ```text
//! cost(i) = uncached(i)                     this prompt's own prefill on i
//!         + queued_prefill(i)               prefill still waiting on i: Σ over its
//!                                           requests without a first byte yet of
//!                                           (uncached tokens + overhead(i)), less
//!                                           what i has computed of them at its
//!                                           learned rate (crate::drain)
//!         + running_weight(i) × in_flight(i) decode work sharing i's steps
//!         + displaced(i)                    what a copy evicts, now or soon:
//!                                           uncached(i) × the share of i's cache
//!                                           in use (all of it when full)
//!         + duplicated(i)                   prefill the fleet does only because of
//!                                           this choice, while the fleet is busy:
//!                                           (uncached(i) − least uncached anywhere)
//!                                           × share of instances with requests
//!         + delayed(i)                      the wait this prefill adds to requests
//!                                           already waiting for a first token on i:
//!                                           uncached(i) × waiting(i)
//! uncached(i) = prompt_tokens − min(prompt_tokens, matched_blocks(i) × block_tokens)
//! ```
//!
//! Why this shape (after Dynamo's "prefill blocks to compute + decode blocks",
//! llm-d's queued-prefill scorer, Preble's E2 and LMetric): time to first token
//! on an instance is the prefill queued ahead of the request plus its own
//! uncached prefill. An engine batches prefills (vLLM's chunked prefill fills
//! each step's token budget from every waiting request), so its prefill time is
//! the tokens it must compute over its prefill rate whatever the number of
//! requests: the two terms add in the same unit and no rate needs configuring.
//! A second request for a prefix the holder has cached adds only its own
//! uncached suffix there.
//!
//! The last term is the price the greedy wait-only model did not see, and why
//! it lost to plain hashing when caches are under pressure: recomputing a
//! prefix on a second instance whose cache is full evicts as many tokens of
//! whatever that instance held least recently, and some later request pays to
//! prefill those again. So while caches are full a prefix leaves its holder
//! only when the holder's excess queue exceeds *twice* the recompute (the
//! prefill now and the one it displaces); while a cache has room, a copy is
//! charged the share of it in use: a cache half full will evict
//! something for about half of what a copy adds before those blocks are
//! reused, and small caches fill within a fleet's first minutes, so copies
//! made early are what later evicts the documents each instance was kept
//! for (issue 30: on two fresh vLLM engines of 80 blocks, copies made while
//! the caches still had room took `kv_aware` to 43.8% of prompt tokens
//! cached against hashing's 62.1%). A cold prefix costs the same on every
//! instance equally full and goes where the queue is shortest.
//!
//! `duplicated` is the same argument for compute rather than cache: prefilling
//! a prefix again on a second instance, when its holder would answer it from
//! cache, is work that delays whoever comes next there — nobody while the
//! fleet idles, someone for certain when every instance is busy. Without it a
//! fresh fleet (a deploy, a restart, a scale-out) copies each document onto
//! whichever instance is idle while its holder is still prefilling it, and
//! the copies fill small caches (issue 30: `kv_aware` cached 54.7% of prompt
//! tokens on two fresh vLLM engines against hashing's 63.3%).
//!
//! `delayed` is the wait a choice adds for the requests already there. An
//! engine fills each step's token budget from every request still
//! prefilling, so a step lasts as long as the tokens it computes: a
//! request's own uncached prefill holds back the first token of every
//! request still waiting on that instance by as long as it takes. A cold
//! prompt on a quiet instance costs only itself; the same prompt beside a
//! cache hit that is a step from its first token costs that hit the whole
//! prefill (issue 30: on two fresh vLLM engines, `kv_aware` sent a new
//! document to the instance where a second question had just been queued,
//! rather than the idle one, because the idle one's cache was fuller, and
//! that question's first token came after 11.9 s instead of ~0.7 s). The
//! term counts requests without a first byte only: decoding requests are
//! slowed by a prefill too, but not their time to first token, and a queue
//! longer than one step's budget is not all held back (an upper bound).
//!
//! A request whose match on an instance rests on blocks still being
//! prefilled there (a document's second question while its first is being
//! prefilled) joins that prefill: an engine schedules waiting requests into
//! the same steps while its token budget lasts, and the blocks are this
//! request's own prefix, so the step the request ahead is charged is not one
//! more to wait for ([`Load::prefilling`]: that one overhead is not charged).
//! Without it, on a fresh fleet still charging the 256-token guess, the
//! first two requests for one document went to two instances (issue 30: the
//! one spread of each real-vLLM first pass, 4 points of prompt tokens).
//!
//! The cost compares one request's wait only, though: a shared system
//! prompt's holder stays cheaper for every new conversation long after it is
//! overloaded, so the policy also caps load (see `longest.rs`), and that cap
//! is what replicates such prefixes.
//!
//! Known approximation: the queued charge is given back at the response's first
//! body byte. For a stream that is the first token; a non-streaming answer
//! sends its first byte at the end, so its charge also covers its decoding
//! and such instances look busier than they are.
//!
//! The constants, in prefill tokens — the first two are guesses that stand
//! for an instance only until its own answers replace them ([`crate::pace`]:
//! `overhead(i)` is its learned fixed cost of a request, `running_weight(i)`
//! an eighth of that; [`Load::overhead_tokens`]):
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

use super::Load;

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
    /// Cached tokens of other prefixes a copy would evict, now (its cache
    /// is full) or before it is reused (the share of its cache in use).
    pub displaced_tokens: u64,
    /// Prefill the fleet does only because of this choice, weighed by how
    /// busy the fleet is ([`Fleet`]).
    pub duplicated_tokens: u64,
    /// The wait its prefill adds to the requests waiting there for a first
    /// token: `uncached_tokens` × [`Load::waiting`].
    pub delayed_tokens: u64,
    /// The sum of the five.
    pub total: u64,
}

/// What a request's costs share across the fleet at one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fleet {
    /// The fewest tokens any available instance would have to prefill.
    pub least_uncached: u64,
    /// Available instances with requests in flight, of `available`.
    pub busy: usize,
    pub available: usize,
}

impl Fleet {
    /// A fleet of no instances yet, for [`Fleet::add`] to count into.
    pub const EMPTY: Self = Self {
        least_uncached: u64::MAX,
        busy: 0,
        available: 0,
    };

    /// The fleet around `costs` (each available instance's own) and `loads`:
    /// the same instances in the same order (a longer one is cut short).
    pub fn of<'a>(costs: &[Cost], loads: impl Iterator<Item = &'a Load>) -> Self {
        let mut fleet = costs.iter().zip(loads).fold(Self::EMPTY, |mut f, (c, l)| {
            f.add(c.uncached_tokens, l);
            f
        });
        if fleet.available == 0 {
            fleet.least_uncached = 0;
        }
        fleet
    }

    /// Counts one more available instance, which would prefill `uncached`
    /// tokens, under `load`.
    pub fn add(&mut self, uncached: u64, load: &Load) {
        self.least_uncached = self.least_uncached.min(uncached);
        self.busy += usize::from(load.in_flight > 0);
        self.available += 1;
    }

    /// The prefill a choice that must compute `uncached` tokens duplicates:
    /// its excess over the least anywhere, weighed by the busy share.
    pub fn duplicated(&self, uncached: u64) -> u64 {
        let extra = uncached.saturating_sub(self.least_uncached);
        extra.saturating_mul(self.busy as u64) / (self.available.max(1) as u64)
    }
}

impl Cost {
    /// This cost with the work it duplicates in `fleet` added.
    pub fn in_fleet(mut self, fleet: &Fleet) -> Self {
        self.duplicated_tokens = fleet.duplicated(self.uncached_tokens);
        self.total = self.total.saturating_add(self.duplicated_tokens);
        self
    }
}

impl CostModel {
    /// A model for blocks of `block_chars` characters.
    pub fn for_block_chars(block_chars: usize) -> Self {
        Self {
            block_tokens: block_tokens(block_chars) as u64,
        }
    }

    /// The cost of a `prompt_tokens` prompt on an instance with `load`.
    pub fn cost(&self, prompt_tokens: u64, load: &Load) -> Cost {
        let uncached = self.uncached(prompt_tokens, load.matched_blocks);
        // Joining a prefill of its own prefix in progress, it shares that
        // request's steps: the step charged for it is not one more to wait.
        let shared_step = if load.prefilling && load.matched_blocks > 0 {
            overhead(load)
        } else {
            0
        };
        let queued = load
            .queued_prefill
            .saturating_sub(shared_step)
            .saturating_add(running_weight(overhead(load)).saturating_mul(load.in_flight as u64));
        let displaced = if load.cache_full() {
            uncached
        } else {
            uncached.saturating_mul(u64::from(load.cache_fill)) / u64::from(FULL_SCALE)
        };
        let delayed = uncached.saturating_mul(load.waiting as u64);
        Cost {
            cached_tokens: prompt_tokens - uncached,
            uncached_tokens: uncached,
            queued_tokens: queued,
            displaced_tokens: displaced,
            duplicated_tokens: 0,
            delayed_tokens: delayed,
            total: uncached
                .saturating_add(queued)
                .saturating_add(displaced)
                .saturating_add(delayed),
        }
    }

    /// Tokens of a `prompt_tokens` prompt an instance holding its first
    /// `matched_blocks` blocks must still prefill.
    pub fn uncached(&self, prompt_tokens: u64, matched_blocks: usize) -> u64 {
        let cached = (matched_blocks as u64)
            .saturating_mul(self.block_tokens)
            .min(prompt_tokens);
        prompt_tokens - cached
    }

    /// What a request adds to its instance's queued prefill until its first byte.
    pub fn queued_charge(&self, prompt_tokens: u64, load: &Load) -> u64 {
        self.uncached(prompt_tokens, load.matched_blocks)
            .saturating_add(overhead(load))
    }
}

/// Prefill tokens one request costs `load`'s instance: learned, or the guess.
pub fn overhead(load: &Load) -> u64 {
    match load.overhead_tokens {
        0 => REQUEST_OVERHEAD,
        n => n,
    }
}

/// [`Load::cache_fill`]'s unit: thousandths of a cache.
pub const FULL_SCALE: u16 = 1000;
/// A cache at 95% of its capacity is full: whatever is added evicts something.
pub const FULL: u16 = 950;

/// Whether `held` fills `capacity` (95% of it, in any one unit), so that
/// whatever is added evicts something: [`Load::cache_full`].
pub fn fills(held: usize, capacity: usize) -> bool {
    fill(held, capacity) >= FULL
}

/// `held` over `capacity` in thousandths (any one unit), at most
/// [`FULL_SCALE`]; an unknown (zero) capacity is empty.
pub fn fill(held: usize, capacity: usize) -> u16 {
    if capacity == 0 {
        return 0;
    }
    let permille = (held as u128 * u128::from(FULL_SCALE)) / capacity as u128;
    permille.min(u128::from(FULL_SCALE)) as u16
}

/// Tokens one index block of `block_chars` characters stands for (at least 1).
pub fn block_tokens(block_chars: usize) -> usize {
    (block_chars / CHARS_PER_TOKEN).max(1)
}

/// Estimated prompt tokens from characters of canonical prompt.
pub fn tokens_of_chars(chars: usize) -> u64 {
    chars.div_ceil(CHARS_PER_TOKEN) as u64
}

/// Prefill tokens charged for each request decoding on an instance whose
/// requests cost `overhead` each: the guessed ratio (256 : 32), so that a
/// decoding request stays a small fraction of one step.
pub fn running_weight(overhead: u64) -> u64 {
    (overhead.saturating_mul(RUNNING_WEIGHT) / REQUEST_OVERHEAD).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(matched_blocks: usize, queued_prefill: u64, in_flight: usize) -> Load {
        Load {
            matched_blocks,
            queued_prefill,
            ..Load::with_in_flight(in_flight)
        }
    }

    #[test]
    fn cached_blocks_cut_the_prompt_cost_and_queues_add_to_it() {
        let m = CostModel::for_block_chars(256);
        assert_eq!(m.block_tokens, 64);
        let cold = m.cost(1000, &load(0, 0, 0));
        let warm = m.cost(1000, &load(10, 0, 0));
        assert_eq!(
            (cold.total, warm.cached_tokens, warm.total),
            (1000, 640, 360)
        );
        // More cached blocks than the prompt has tokens: capped, never negative.
        assert_eq!(m.cost(100, &load(10, 0, 0)).total, 0);
        let busy = m.cost(1000, &load(10, 500, 2));
        assert_eq!(busy.queued_tokens, 500 + 2 * RUNNING_WEIGHT);
        assert_eq!(busy.total, 360 + 500 + 2 * RUNNING_WEIGHT);
    }

    #[test]
    fn a_copy_into_a_full_cache_pays_for_what_it_evicts() {
        let m = CostModel::for_block_chars(256);
        let mut full = load(10, 0, 0);
        full.cache_fill = FULL;
        let c = m.cost(1000, &full);
        assert_eq!(
            (c.uncached_tokens, c.displaced_tokens, c.total),
            (360, 360, 720)
        );
        // A prompt held whole displaces nothing, full cache or not.
        full.matched_blocks = 16;
        assert_eq!(m.cost(1000, &full).total, 0);
        // An empty cache: a copy is free beyond its own prefill.
        assert_eq!(m.cost(1000, &load(0, 0, 0)).displaced_tokens, 0);
        // Half full: half of what it adds will evict something.
        let mut half = load(0, 0, 0);
        half.cache_fill = fill(40, 80);
        assert_eq!((half.cache_fill, half.cache_full()), (500, false));
        assert_eq!(m.cost(1000, &half).displaced_tokens, 500);
    }

    #[test]
    fn fill_is_thousandths_capped_and_zero_without_a_capacity() {
        assert_eq!(fill(0, 80), 0);
        assert_eq!(fill(76, 80), 950);
        assert!(fills(76, 80) && !fills(75, 80));
        assert_eq!(fill(200, 80), FULL_SCALE);
        assert_eq!(fill(5, 0), 0);
        assert_eq!(fill(usize::MAX, usize::MAX), FULL_SCALE);
    }

    #[test]
    fn recomputing_what_another_holds_costs_the_busy_fleet_its_work() {
        let m = CostModel::for_block_chars(256);
        // The holder is prefilling the document; the other instance is idle.
        let holder = load(16, 1000 + REQUEST_OVERHEAD, 1);
        let idle = load(0, 0, 0);
        let own = [m.cost(1024, &holder), m.cost(1024, &idle)];
        let fleet = Fleet::of(&own, [&holder, &idle].into_iter());
        assert_eq!(
            (fleet.least_uncached, fleet.busy, fleet.available),
            (0, 1, 2)
        );
        let [h, i] = own.map(|c| c.in_fleet(&fleet));
        assert_eq!((h.duplicated_tokens, i.duplicated_tokens), (0, 512));
        // Its own wait is a little shorter elsewhere; the fleet's is not.
        assert!(
            own[1].total < own[0].total && h.total < i.total,
            "{h:?} {i:?}"
        );
        // An idle fleet: a copy delays nobody.
        let calm = Fleet::of(&own, [&idle, &idle].into_iter());
        assert_eq!(own[1].in_fleet(&calm), own[1]);
    }

    #[test]
    fn a_prefill_beside_waiting_requests_costs_each_of_them_its_length() {
        let m = CostModel::for_block_chars(256);
        // Issue 30's decision: a new document (uncached everywhere), one
        // instance idle with a fuller cache, the other with a second question
        // just queued (37 tokens) and an emptier cache.
        let mut idle = load(0, 0, 0);
        idle.cache_fill = 550;
        let mut beside = load(0, 37, 1);
        beside.cache_fill = 350;
        beside.waiting = 1;
        let (i, b) = (m.cost(437, &idle), m.cost(437, &beside));
        assert_eq!((i.delayed_tokens, b.delayed_tokens), (0, 437));
        assert!(i.total < b.total, "{i:?} {b:?}");
        // Without the term the emptier cache wins, and the queued question
        // waits for the whole document.
        beside.waiting = 0;
        assert!(m.cost(437, &beside).total < i.total);
        // A cache hit adds only its own few tokens to each request waiting.
        let mut holder = load(6, 300, 2);
        holder.waiting = 2;
        assert_eq!(m.cost(437, &holder).delayed_tokens, 2 * 53);
    }

    #[test]
    fn a_queued_request_costs_at_least_the_overhead() {
        let m = CostModel::for_block_chars(256);
        assert_eq!(m.queued_charge(640, &load(10, 0, 0)), REQUEST_OVERHEAD);
        assert_eq!(
            m.queued_charge(1000, &load(0, 0, 0)),
            1000 + REQUEST_OVERHEAD
        );
    }

    #[test]
    fn an_instances_learned_overhead_replaces_the_guess() {
        let m = CostModel::for_block_chars(256);
        let mut fast = load(0, 500, 2);
        fast.overhead_tokens = 64;
        assert_eq!(m.queued_charge(1000, &fast), 1064);
        assert_eq!(m.cost(1000, &fast).queued_tokens, 500 + 2 * 8);
        fast.overhead_tokens = 0;
        assert_eq!(m.cost(1000, &fast).queued_tokens, 500 + 2 * RUNNING_WEIGHT);
    }
}
