//! The discrete-event loop: trace arrivals and instances' step ends, in virtual
//! time order. Each arrival is routed by the gateway's own [`Policy`] from the
//! loads the gateway would see: in-flight counts (dispatched and not finished,
//! as the in-flight guards count them), so `concurrency_threshold` overflow
//! happens exactly as it would live, and queued prefill (each request's
//! `queued_charge` until its first token). For cache-aware strategies the
//! engine also keeps the gateway's [`BlockIndex`] per instance: a request's
//! `matched_blocks` come from it and its chain is inserted where it goes, as
//! `upstream::forward` does. Cost: O(log) per cache block touched plus
//! O(instances + running) per event; no allocation per step; for cache-aware
//! strategies O(instances · log chain + chain) more per arrival.

use serde::Serialize;

use kvgate_routing::{BlockIndex, CostModel, Load, Policy, Reason, Request};

use super::chain::Chains;
use super::instance::{Instance, Record, Timing};
use super::workload::Workload;

/// What one run of the fleet measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunStats {
    pub requests: usize,
    pub rejected: usize,
    /// Cached prompt tokens over all prompt tokens (vLLM's prefix-cache hit rate).
    pub hit_rate: f64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    /// Each instance's share of requests.
    pub shares: Vec<f64>,
    pub max_share: f64,
    /// Share of requests not placed on their preferred instance (overflow or
    /// fallback: the ring's choice was full, or every instance was).
    pub overflow: f64,
    /// Cache-aware: share placed off the instance holding most of the prompt
    /// because its queue outweighed the prefix (`cache_spread`).
    pub spread: f64,
    /// Cache-aware: share that no instance held any of (`cold`).
    pub cold: f64,
    /// Cache-aware: prompt tokens the gateway's index believed cached on the
    /// chosen instance, over all prompt tokens (against `hit_rate`, what it got).
    pub believed_hit: f64,
    /// Virtual seconds from the first arrival to the last token.
    pub makespan_s: f64,
}

/// The gateway's view for cache-aware strategies: each request's block chain
/// and the capacity, in chain blocks, of each instance's index.
#[derive(Debug, Clone, Copy)]
pub struct CacheAware<'a> {
    pub chains: &'a Chains,
    pub index_blocks: usize,
}

/// How the gateway routes: the policy, each request's key, and for cache-aware
/// strategies the chains to index.
#[derive(Debug, Clone, Copy)]
pub struct Routing<'a> {
    pub policy: &'a dyn Policy,
    /// `keys[i]` is request `i`'s routing key.
    pub keys: &'a [u64],
    pub cache_aware: Option<CacheAware<'a>>,
}

/// Counts of where requests went and why.
#[derive(Debug)]
struct Tally {
    placed: Vec<usize>,
    overflowed: usize,
    spread: usize,
    cold: usize,
    believed: u64,
}

impl Tally {
    fn count(&mut self, target: usize, reason: Reason) {
        self.placed[target] += 1;
        match reason {
            Reason::Overflow | Reason::Fallback => self.overflowed += 1,
            Reason::CacheSpread => self.spread += 1,
            Reason::Cold => self.cold += 1,
            _ => {}
        }
    }
}

/// Settle instance `i`'s inserts whose request has had its first token
/// (or was refused: it will not have one).
fn settle(indexes: &Option<Indexes<'_>>, pending: &mut Vec<(usize, u64)>, i: usize, rec: &Record) {
    let Some(x) = indexes else { return };
    pending.retain(|&(req, stamp)| {
        let answered = rec.ttft.get(req).is_none_or(|t| !t.is_nan());
        if answered {
            x.of[i].settle(stamp);
        }
        !answered
    });
}

/// The gateway's per-instance indexes and what they are looked up with.
struct Indexes<'a> {
    chains: &'a Chains,
    model: CostModel,
    of: Vec<BlockIndex>,
}

/// Replay `w` through `instances` instances routed by `routing`, with
/// arrivals compressed by `speedup`.
pub fn run(
    w: &Workload,
    routing: Routing<'_>,
    timing: Timing,
    instances: usize,
    speedup: f64,
) -> RunStats {
    let n = instances.max(1);
    let speedup = if speedup.is_finite() && speedup > 0.0 {
        speedup
    } else {
        1.0
    };
    let policy = routing.policy;
    let indexes = routing.cache_aware.map(|c| Indexes {
        chains: c.chains,
        model: CostModel::for_block_chars(c.chains.block_chars),
        of: (0..n)
            .map(|_| BlockIndex::new(c.index_blocks, c.chains.block_chars))
            .collect(),
    });
    let mut fleet: Vec<Instance> = (0..n).map(|_| Instance::new(timing)).collect();
    let mut rec = Record::new(w.requests.len());
    let mut loads = vec![Load::with_in_flight(0); n];
    let mut work = vec![0u64; n];
    let mut tally = Tally {
        placed: vec![0; n],
        overflowed: 0,
        spread: 0,
        cold: 0,
        believed: 0,
    };
    // Each instance's inserts whose request has no first token yet, by
    // request: settled at the first token, as the gateway's guard does.
    let mut unsettled: Vec<Vec<(usize, u64)>> = vec![Vec::new(); n];
    let mut next = 0usize;
    loop {
        let step = fleet
            .iter()
            .enumerate()
            .filter_map(|(i, inst)| inst.step_end().map(|end| (i, end)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let arrival = w.requests.get(next).map(|r| r.arrival_s / speedup);
        match (arrival, step) {
            // A step ending at an arrival's instant finishes first, so its
            // finished requests no longer count as in flight.
            (Some(at), Some((i, end))) if end <= at => {
                fleet[i].finish(w, &mut rec);
                settle(&indexes, &mut unsettled[i], i, &rec);
            }
            (Some(at), _) => {
                let chain = indexes.as_ref().map_or(&[][..], |x| x.chains.chain(next));
                for (i, (load, inst)) in loads.iter_mut().zip(&fleet).enumerate() {
                    load.in_flight = inst.in_flight();
                    load.queued_prefill = inst.queued_prefill(at);
                    load.waiting = inst.queued_requests();
                    load.overhead_tokens = inst.overhead_tokens();
                    load.recent_work = work[i];
                    if let Some(x) = &indexes {
                        let l = x.of[i].lookup(chain);
                        load.matched_blocks = l.matched;
                        load.cache_fill = l.fill;
                        load.prefilling = l.prefilling;
                    }
                }
                let request = Request {
                    key: routing.keys.get(next).copied().unwrap_or(0),
                    prompt_tokens: w.requests.get(next).map_or(0, |r| r.prompt_tokens as u64),
                    block_tokens: 0,
                    // A trace's requests are hashed blocks, not turns.
                    opening_tokens: None,
                    home: None,
                };
                let plan = policy.plan(&request, &loads);
                let target = plan.order.first().copied().unwrap_or(0).min(n - 1);
                tally.count(target, plan.reason);
                let load = loads[target];
                let charge = policy.queued_charge(&request, &load);
                // Work given out, undecayed: a simulated run is short.
                work[target] += charge;
                if let Some(x) = &indexes {
                    let uncached = x.model.uncached(request.prompt_tokens, load.matched_blocks);
                    tally.believed += request.prompt_tokens - uncached;
                    let stamp = x.of[target].insert(chain).stamp();
                    unsettled[target].push((next, stamp));
                }
                fleet[target].submit(next, at, charge, w, &mut rec);
                next += 1;
            }
            (None, Some((i, _))) => {
                fleet[i].finish(w, &mut rec);
                settle(&indexes, &mut unsettled[i], i, &rec);
            }
            (None, None) => break,
        }
    }
    summarize(w, &rec, &tally, speedup)
}

fn summarize(w: &Workload, rec: &Record, tally: &Tally, speedup: f64) -> RunStats {
    let total = w.requests.len();
    let prompt: usize = w.requests.iter().map(|r| r.prompt_tokens).sum();
    let cached: usize = rec.cached.iter().sum();
    let mut ttft: Vec<f64> = rec.ttft.iter().copied().filter(|t| t.is_finite()).collect();
    ttft.sort_by(f64::total_cmp);
    let mean = if ttft.is_empty() {
        0.0
    } else {
        ttft.iter().sum::<f64>() / ttft.len() as f64
    };
    let shares: Vec<f64> = tally.placed.iter().map(|&p| share(p, total)).collect();
    let first = w.requests.first().map_or(0.0, |r| r.arrival_s / speedup);
    RunStats {
        requests: total,
        rejected: rec.rejected,
        hit_rate: share(cached, prompt),
        ttft_mean_ms: mean * 1e3,
        ttft_p50_ms: percentile(&ttft, 0.50) * 1e3,
        ttft_p90_ms: percentile(&ttft, 0.90) * 1e3,
        ttft_p99_ms: percentile(&ttft, 0.99) * 1e3,
        max_share: shares.iter().copied().fold(0.0, f64::max),
        shares,
        overflow: share(tally.overflowed, total),
        spread: share(tally.spread, total),
        cold: share(tally.cold, total),
        believed_hit: share(
            usize::try_from(tally.believed).unwrap_or(usize::MAX),
            prompt,
        ),
        makespan_s: (rec.end - first).max(0.0),
    }
}

fn share(part: usize, whole: usize) -> f64 {
    super::trace::ratio(part, whole)
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
