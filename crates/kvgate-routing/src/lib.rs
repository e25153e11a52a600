//! Routing policy: given a request's key and the instances' loads, in what
//! order should the instances be tried? The upstream code does the trying.
//!
//! Strategies implement [`Policy`]. The ring ([`ring`]), the per-instance
//! block index ([`index`]) and the cost model ([`cost`]) are pure data
//! structures built from ids and numbers, so each can be tested and benchmarked
//! alone; nothing here knows HTTP or the upstream module.

mod bounded;
pub mod cost;
pub mod defaults;
pub mod drain;
pub mod held;
pub mod index;
mod longest;
pub mod pace;
pub mod ring;
mod simple;
pub mod units;

pub use bounded::PrefixAware;
pub use cost::{Cost, CostModel};
pub use index::{BlockIndex, Lookup};
pub use longest::LongestPrefix;
pub use ring::Ring;
pub use simple::{LeastOutstanding, Random, RoundRobin};

/// The routing strategies a config can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// SageMaker's `PREFIX_AWARE`: a fixed window hashed onto a bounded-load ring.
    PrefixAware,
    /// HyperPod's `prefixaware`: the longest cached prefix, weighed against queued prefill.
    LongestPrefix,
    /// HyperPod's `kvaware`: the same cost model over what each instance's KV
    /// events say it holds, by real token ids.
    KvAware,
    LeastOutstandingRequests,
    Random,
    RoundRobin,
}

impl Strategy {
    /// Accepts snake_case names and SageMaker's spellings (`PREFIX_AWARE`, …),
    /// in any case. The underscore matters for one pair: SageMaker's
    /// `PREFIX_AWARE` / `prefix_aware` is the hashing strategy, HyperPod's
    /// `prefixaware` (no underscore) its longest-prefix routing.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "prefix_aware" => Some(Self::PrefixAware),
            "longest_prefix" | "prefixaware" => Some(Self::LongestPrefix),
            "kv_aware" | "kvaware" => Some(Self::KvAware),
            "least_outstanding_requests" | "least_outstanding" => {
                Some(Self::LeastOutstandingRequests)
            }
            "random" => Some(Self::Random),
            "round_robin" | "roundrobin" => Some(Self::RoundRobin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::PrefixAware => "prefix_aware",
            Self::LongestPrefix => "longest_prefix",
            Self::KvAware => "kv_aware",
            Self::LeastOutstandingRequests => "least_outstanding_requests",
            Self::Random => "random",
            Self::RoundRobin => "round_robin",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s).ok_or_else(|| {
            format!(
                "unknown strategy {s:?} (kv_aware, longest_prefix, prefix_aware, least_outstanding_requests, random, round_robin)"
            )
        })
    }
}

impl Strategy {
    /// Whether requests need a block chain and instances a [`BlockIndex`]
    /// (`kv_aware` keeps one as its fallback).
    pub fn uses_index(self) -> bool {
        matches!(self, Self::LongestPrefix | Self::KvAware)
    }

    /// Whether requests are tokenized and instances follow KV events.
    pub fn uses_events(self) -> bool {
        self == Self::KvAware
    }

    /// One line on what the strategy does, for `kvgate check`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::PrefixAware => {
                "SageMaker PREFIX_AWARE: hash of the first prefix_length units, bounded-load consistent hashing"
            }
            Self::LongestPrefix => {
                "HyperPod prefixaware: longest cached prefix per instance, weighed against the prefill queued there"
            }
            Self::KvAware => {
                "HyperPod kvaware: longest prefix each instance's KV events report, by real token ids, weighed against the prefill queued there"
            }
            Self::LeastOutstandingRequests => "fewest requests in flight",
            Self::Random => "uniformly random",
            Self::RoundRobin => "each instance in turn",
        }
    }
}

/// What a policy knows of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Request {
    /// The routing key (tenant, partition, window): the ring position.
    pub key: u64,
    /// Estimated prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens a matched block stands for, as learned of the engine
    /// ([`units::Density`]); 0: the policy's own ([`CostModel::block_tokens`]).
    pub block_tokens: u64,
    /// Estimated tokens of a conversation's opening (its tools and system
    /// prompt, what other conversations may share) when the prompt goes on
    /// past it with an answered question (`kvgate_prefix::Window`); `None`
    /// for a first question or a raw prompt. An instance holding more than
    /// the opening holds history that only this conversation's earlier turns
    /// put there ([`LongestPrefix`]).
    pub opening_tokens: Option<u64>,
    /// Where a session starts, so that sessions spread over the fleet as
    /// they start ([`LongestPrefix`]); `None`: by cost alone.
    pub home: Option<Home>,
}

/// One session started, in [`Load::recent_sessions`]: a fixed-point unit,
/// so that halving a decaying count keeps 3 sessions apart from 2.
pub const SESSION_UNIT: u64 = 1024;

/// How a session's start is placed ([`Request::home`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// A session hint's first turn (Anthropic's `metadata.user_id`): the
    /// request's key is the session's. It starts on the instance where the
    /// fewest conversations started lately ([`Load::recent_sessions`]) of
    /// those within one prompt of the cheapest.
    Hinted,
    /// A chat or Messages first turn under a partition (a `prompt_cache_key`,
    /// or SageMaker's prefix-aware-id header): as [`Home::Hinted`] when
    /// nothing in its partition is held anywhere yet.
    Keyed,
    /// A hinted session's later turn: by cost, as any conversation, but when
    /// the cost model takes it off the instance that last served it
    /// ([`Load::hosts_session`]), it moves, of the instances cheaper than
    /// staying, to the one where the fewest sessions started lately, not to
    /// the one cheapest this instant.
    Lives,
    /// A conversation nothing else names, on its early turns: this key,
    /// taken from its opening and first question. It leads only while the
    /// instance that would otherwise answer is busier.
    Named(u64),
    /// A chat or Messages conversation's first question that nothing else
    /// names (no session hint, no partition), with its opening's estimated
    /// tokens (its tools and system prompt): while no instance holds more of
    /// it than the opening, it starts, of the instances within one engine
    /// step of the cheapest, on the one where the fewest sessions started
    /// lately.
    First(u64),
}

impl Request {
    /// A request known only by its key (prompt-blind strategies, tests).
    pub fn with_key(key: u64) -> Self {
        Self {
            key,
            ..Self::default()
        }
    }
}

/// What a policy knows of one instance at decision time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Requests dispatched and not yet finished.
    pub in_flight: usize,
    /// False while the instance is ejected or cooling down after a failure.
    pub available: bool,
    /// Estimated prefill tokens of its requests that have no first byte yet,
    /// less what its engine is believed to have computed of them ([`drain`]).
    pub queued_prefill: u64,
    /// Requests there without a first byte yet (the fleet's, not one
    /// replica's): this request's prefill would share their steps and delay
    /// each of them by as much ([`cost`]).
    pub waiting: usize,
    /// Leading blocks of this request's chain the instance holds (cache-aware
    /// strategies; 0 otherwise).
    pub matched_blocks: usize,
    /// How full its prefix cache is, in thousandths of its capacity
    /// ([`cost::FULL`] and above: full, whatever a request adds there evicts
    /// as much of what it held). A copy is charged that share of what it
    /// adds (cache-aware strategies; see [`cost`]).
    pub cache_fill: u16,
    /// Prompt tokens sent to it lately (decaying), so that among instances
    /// equal in cost the one given least work leads and none sits idle.
    pub recent_work: u64,
    /// Sessions (first turns with a [`Home::Hinted`], [`Home::Keyed`] or
    /// [`Home::First`] home, and hinted sessions that moved there) started
    /// there lately, in
    /// [`SESSION_UNIT`]s, decaying over a minute: a session's first turn
    /// starts where the fewest live, so sessions, which stay where they
    /// start, spread by count and not by the queue of one instant.
    pub recent_sessions: u64,
    /// The request's hinted session was last served here (by this gateway):
    /// a later first turn of it (a sub-agent, a new task) returns here
    /// ([`Home::Hinted`]).
    pub hosts_session: bool,
    /// Prefill tokens one request costs the instance, as its answers showed
    /// ([`pace::Pace`]); 0: not known, [`cost::REQUEST_OVERHEAD`].
    pub overhead_tokens: u64,
    /// Its match rests on blocks a request queued there is prefilling now:
    /// this one would join that prefill's steps, not wait a step behind it
    /// ([`cost`]).
    pub prefilling: bool,
}

impl Load {
    /// Whether its cache is full ([`cost::FULL`]).
    pub fn cache_full(&self) -> bool {
        self.cache_fill >= cost::FULL
    }

    /// An available instance with `in_flight` requests and nothing else known.
    pub fn with_in_flight(in_flight: usize) -> Self {
        Self {
            in_flight,
            available: true,
            ..Self::default()
        }
    }
}

/// Why the first candidate was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The key's preferred instance on the ring.
    Affinity,
    /// The preferred instance was full; the next one on the ring under its limit.
    Overflow,
    /// Every available instance was full; the least loaded.
    Fallback,
    /// A strategy that ignores prefixes (random, round robin, least outstanding).
    Balance,
    /// No instance is available; trying the unavailable ones as a last resort.
    LastResort,
    /// Cache-aware: the cheapest instance holds the longest cached prefix.
    CacheHit,
    /// Cache-aware: an instance holding more of the prompt was busier than
    /// recomputing it here (a hot prefix spreading to another instance).
    CacheSpread,
    /// Cache-aware: no instance holds any of the prompt; the least loaded.
    Cold,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Affinity => "affinity",
            Self::Overflow => "overflow",
            Self::Fallback => "fallback",
            Self::Balance => "balance",
            Self::LastResort => "last_resort",
            Self::CacheHit => "cache_hit",
            Self::CacheSpread => "cache_spread",
            Self::Cold => "cold",
        }
    }
}

/// Candidates in the order to try them, and why the first one leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub order: Vec<usize>,
    pub reason: Reason,
}

/// A routing strategy. Implementations must be cheap: this runs on every request.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// Order every instance index of `loads` by preference for `request`.
    fn plan(&self, request: &Request, loads: &[Load]) -> Plan;

    /// Each instance's estimated cost, for strategies that weigh one (`explain`).
    fn costs(&self, _request: &Request, _loads: &[Load]) -> Option<Vec<Cost>> {
        None
    }

    /// Prefill tokens `request` adds to an instance's queue until its first
    /// byte, given how much of it the instance holds.
    fn queued_charge(&self, request: &Request, load: &Load) -> u64 {
        request.prompt_tokens.saturating_add(cost::overhead(load))
    }

    /// Whether `load`'s instance holds `request`'s conversation past its
    /// opening (its earlier turns), as this strategy's placement judges it:
    /// where a turn served elsewhere has moved the conversation. Strategies
    /// that index no prompts know of no history.
    fn holds_history(&self, _request: &Request, _load: &Load) -> bool {
        false
    }
}

/// Settings every policy is built from.
#[derive(Debug, Clone)]
pub struct PolicySpec<'a> {
    pub strategy: Strategy,
    pub ids: &'a [String],
    pub virtual_nodes: usize,
    pub concurrency_threshold: usize,
    pub balance_factor: Option<f64>,
    /// Characters per index block (cache-aware strategies).
    pub block_chars: usize,
    /// Tokens per engine block (`kv_aware`).
    pub block_size: usize,
}

/// Build the policy a config names.
pub fn build(spec: &PolicySpec<'_>) -> Box<dyn Policy> {
    match spec.strategy {
        Strategy::PrefixAware => Box::new(PrefixAware::new(
            Ring::new(spec.ids, spec.virtual_nodes),
            spec.concurrency_threshold,
            spec.balance_factor,
        )),
        Strategy::LongestPrefix => Box::new(LongestPrefix::new(
            Ring::new(spec.ids, spec.virtual_nodes),
            spec.concurrency_threshold,
            spec.balance_factor,
            CostModel::for_block_chars(spec.block_chars),
        )),
        // The same placement; its matched blocks are engine blocks of real tokens.
        Strategy::KvAware => Box::new(LongestPrefix::new(
            Ring::new(spec.ids, spec.virtual_nodes),
            spec.concurrency_threshold,
            spec.balance_factor,
            CostModel {
                block_tokens: spec.block_size.max(1) as u64,
            },
        )),
        Strategy::LeastOutstandingRequests => Box::new(LeastOutstanding),
        Strategy::Random => Box::new(Random),
        Strategy::RoundRobin => Box::new(RoundRobin::default()),
    }
}

/// Put `first` at the front of `order`; keep the rest in their order.
fn lead_with(order: &mut [usize], first: usize) {
    if let Some(pos) = order.iter().position(|&i| i == first) {
        order[..=pos].rotate_right(1);
    }
}

/// The key's ring walk over the instances of `loads`, available ones first.
fn ring_order(ring: &Ring, key: u64, loads: &[Load]) -> Vec<usize> {
    let mut order: Vec<usize> = ring.walk(key).filter(|&i| i < loads.len()).collect();
    available_first(&mut order, loads);
    order
}

/// Available instances first (in the given order), unavailable ones last.
fn available_first(order: &mut Vec<usize>, loads: &[Load]) {
    let (mut up, down): (Vec<usize>, Vec<usize>) = order
        .iter()
        .partition(|&&i| loads.get(i).is_some_and(|l| l.available));
    up.extend(down);
    *order = up;
}

/// The per-instance cap implied by a balance factor c: ⌈c·(m+1)/n⌉ for m in
/// flight over n available instances (Mirrokni, Thorup, Zadimoghaddam).
fn balance_cap(balance_factor: Option<f64>, loads: &[Load]) -> Option<usize> {
    let c = balance_factor?;
    let (up, total) = loads
        .iter()
        .filter(|l| l.available)
        .fold((0usize, 0usize), |(n, m), l| (n + 1, m + l.in_flight));
    if up == 0 {
        return None;
    }
    let cap = (c * (total + 1) as f64 / up as f64).ceil();
    Some(cap.max(1.0) as usize)
}
