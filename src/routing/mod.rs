//! Routing policy: given a request's key and the instances' loads, in what
//! order should the instances be tried? The upstream code does the trying.
//!
//! Strategies implement [`Policy`]; the ring ([`ring`]) is a pure data
//! structure built from instance ids so it can be tested and benchmarked alone.

mod bounded;
pub mod ring;
mod simple;

pub use bounded::PrefixAware;
pub use ring::Ring;
pub use simple::{LeastOutstanding, Random, RoundRobin};

/// The routing strategies a config can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    PrefixAware,
    LeastOutstandingRequests,
    Random,
    RoundRobin,
}

impl Strategy {
    /// Accepts snake_case names and SageMaker's spellings (`PREFIX_AWARE`, …).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "prefix_aware" | "prefixaware" => Some(Self::PrefixAware),
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
            Self::LeastOutstandingRequests => "least_outstanding_requests",
            Self::Random => "random",
            Self::RoundRobin => "round_robin",
        }
    }
}

/// What a policy knows of one instance at decision time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Requests dispatched and not yet finished.
    pub in_flight: usize,
    /// False while the instance is ejected or cooling down after a failure.
    pub available: bool,
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
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Affinity => "affinity",
            Self::Overflow => "overflow",
            Self::Fallback => "fallback",
            Self::Balance => "balance",
            Self::LastResort => "last_resort",
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
    /// Order every instance index of `loads` by preference for a request with `key`.
    fn plan(&self, key: u64, loads: &[Load]) -> Plan;
}

/// Settings every policy is built from.
#[derive(Debug, Clone)]
pub struct PolicySpec<'a> {
    pub strategy: Strategy,
    pub ids: &'a [String],
    pub virtual_nodes: usize,
    pub concurrency_threshold: usize,
    pub balance_factor: Option<f64>,
}

/// Build the policy a config names.
pub fn build(spec: &PolicySpec<'_>) -> Box<dyn Policy> {
    match spec.strategy {
        Strategy::PrefixAware => Box::new(PrefixAware::new(
            Ring::new(spec.ids, spec.virtual_nodes),
            spec.concurrency_threshold,
            spec.balance_factor,
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

/// Available instances first (in the given order), unavailable ones last.
fn available_first(order: &mut Vec<usize>, loads: &[Load]) {
    let (mut up, down): (Vec<usize>, Vec<usize>) = order
        .iter()
        .partition(|&&i| loads.get(i).is_some_and(|l| l.available));
    up.extend(down);
    *order = up;
}
