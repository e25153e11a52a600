//! Cache-aware placement (`longest_prefix`, HyperPod's `prefixaware`): the
//! instance where this prompt's first token is expected soonest, weighing the
//! prefix each instance holds against the prefill already queued on it
//! ([`super::cost`]).
//!
//! Candidates are the available instances under `concurrency_threshold` and
//! under the bounded-load cap ⌈c·(m+1)/n⌉ + 1 (c = `balance_factor`, 1.5 by
//! default for this strategy). The cap is what turns a prefix too hot for one
//! instance into a replicated one: the cost model alone compares this request's
//! wait only, and a cached request always waits less on its holder than a cold
//! prefill elsewhere — so without the cap one holder would take all of a shared
//! system prompt's conversations.
//!
//! The cap does not bind a conversation's continuation on an instance that
//! holds more of it than its opening ([`Request::opening_tokens`]: tools and
//! system prompt, before its first answered question): what lies past the
//! opening is that one conversation's own history, which no copy elsewhere
//! can serve and whose copy would replicate nothing but that conversation's
//! turns. There it stays until the instance's queue outweighs recomputing
//! it, as the cost model weighs it; the cap still decides where each
//! conversation starts. Without this, at low load (a cap of 2–3 requests an
//! instance) a coding agent's 40,000-token session was pushed off its holder
//! whenever two other sessions were running there, and recomputed in full on
//! an instance holding none of it (3.5 s to a first token against 25 ms).
//!
//! A session's start ([`Request::home`]: a session hint's first turn, a
//! keyed chat's first turn when nothing of it is held anywhere, or a chat
//! conversation's early turns, named by its opening and first question) is
//! placed for the session's whole life, not for this instant. A hinted or
//! keyed first turn goes, among the instances whose cost is within its whole
//! prompt of the cheapest, to the one where the fewest sessions started
//! lately ([`Load::recent_sessions`], a minute's half-life, to half a
//! session; ties by the work given lately, then the ring walk), or, for a
//! later first turn of a hinted
//! session (a new task, a sub-agent), back to the instance that last served
//! it ([`Load::hosts_session`]). A hinted session the cost model moves off
//! that instance goes, of those cheaper than staying, where the fewest
//! sessions started ([`Home::Lives`]). By cost alone every new session would
//! go where the shared system prompt is already held until that instance's
//! queue outweighed a copy, and the sessions, each staying where it starts,
//! would leave the rest of the fleet idle (coding agents: one instance of four
//! with no session at all over Messages, two over chat). The ring alone
//! spreads starts only as evenly as chance (24 agent sessions over 4
//! instances: a median 12 points off an even share); counting starts makes
//! them 6 each, and each instance pays the shared prompt's prefill once. The
//! count is shared with peer replicas like the rest of the load. A chat body
//! names no session, so a chat conversation is known only from its first
//! answer on: an early turn moves to its ring home, recomputing the turns
//! already answered, when the instance it would otherwise go to is busier
//! and the home holds its opening or nothing ([`session_home`]). Its first
//! question, while no instance holds more of it than its opening, starts
//! where the fewest sessions started of the instances within one engine
//! step of the cheapest (the fleet's median learned step, [`first_turn`]);
//! a later turn the cost model takes off the instances holding its history
//! moves the same way, and counts as a session started where it goes
//! ([`moving_turn`]).
//!
//! The least [`Cost::total`] leads; among equal costs (a cold prefix on an
//! idle fleet) the instance given the least work lately
//! ([`Load::recent_work`]), so a few hot keys cannot leave an instance idle;
//! remaining ties go by the key's ring walk. The rest follow by cost as
//! failover. When every instance is full the least costly one leads anyway
//! (reason `fallback`). O(instances · log instances).

use super::cost::Fleet;
use super::{Cost, CostModel, Load, Plan, Policy, Reason, Request, Ring, balance_cap, ring_order};

#[path = "longest_homes.rs"]
mod homes;
use homes::{first_turn, holds_history, moving_turn, session_home};

/// An available instance's place in the plan.
struct Candidate {
    /// Its place in the key's ring walk among the available instances.
    ring: usize,
    /// Its cost before the work it would duplicate for the fleet.
    own: u64,
    /// It holds the request's opening (7/8 of its estimate at least) and
    /// none of the conversation past it, or nothing at all: a conversation
    /// moved there recomputes no shared prompt, or makes an idle instance its
    /// first copy, and is not sent back to where it was before.
    opens: bool,
    full: bool,
    total: u64,
    uncached: u64,
    work: u64,
    instance: usize,
}

#[derive(Debug, Clone)]
pub struct LongestPrefix {
    ring: Ring,
    threshold: usize,
    balance_factor: Option<f64>,
    model: CostModel,
}

impl LongestPrefix {
    pub fn new(
        ring: Ring,
        threshold: usize,
        balance_factor: Option<f64>,
        model: CostModel,
    ) -> Self {
        Self {
            ring,
            threshold: threshold.max(1),
            balance_factor,
            model,
        }
    }

    fn cost_of(&self, request: &Request, load: &Load) -> Cost {
        self.model_for(request).cost(request.prompt_tokens, load)
    }

    /// The model with the request's learned block size, where it has one.
    fn model_for(&self, request: &Request) -> CostModel {
        match request.block_tokens {
            0 => self.model,
            t => CostModel { block_tokens: t },
        }
    }
}

impl Policy for LongestPrefix {
    fn plan(&self, request: &Request, loads: &[Load]) -> Plan {
        let mut order = ring_order(&self.ring, request.key, loads);
        let up = order.iter().take_while(|&&i| loads[i].available).count();
        if up == 0 {
            return Plan {
                order,
                reason: Reason::LastResort,
            };
        }
        // One request of slack over the bounded-load cap: at low load the cap
        // is 1, and a second request sharing a prefix should not be forced off
        // its holder merely because the first is still running.
        let limit = balance_cap(self.balance_factor, loads)
            .map_or(self.threshold, |cap| (cap + 1).min(self.threshold));
        // Two passes over the available instances in ring order, filling one
        // vector on this per-request path: the first takes each one's own
        // cost and counts the fleet (the least uncached, the busy, the best
        // match); the second adds the work each would duplicate, which needs
        // the least uncached of all.
        let model = self.model_for(request);
        let mut keyed: Vec<Candidate> = Vec::with_capacity(up);
        let (mut fleet, mut best_match) = (Fleet::EMPTY, 0);
        for (ring, &instance) in order[..up].iter().enumerate() {
            let l = &loads[instance];
            let c = model.cost(request.prompt_tokens, l);
            fleet.add(c.uncached_tokens, l);
            best_match = best_match.max(l.matched_blocks);
            let history = holds_history(request, l, model);
            keyed.push(Candidate {
                ring,
                own: c.total,
                opens: l.cache_fill == 0
                    || ((l.matched_blocks as u64 + 1)
                        .saturating_mul(model.block_tokens)
                        .saturating_mul(8)
                        >= request.opening_tokens.unwrap_or(0).saturating_mul(7)
                        && !history),
                full: l.in_flight >= self.threshold || (l.in_flight >= limit && !history),
                total: c.total,
                uncached: c.uncached_tokens,
                work: l.recent_work,
                instance,
            });
        }
        for k in &mut keyed {
            k.total = k.total.saturating_add(fleet.duplicated(k.uncached));
        }
        // By (not full, cost, recent work); remaining ties keep ring order.
        // Stable, not unstable with the ring rank as a last key: most of a
        // large fleet ties (idle, nothing matched), and the stable sort takes
        // those runs whole (1,000 instances: 30 against 48 µs a plan).
        keyed.sort_by_key(|k| (k.full, k.total, k.work));
        let home = session_home(&self.ring, request, loads, &keyed)
            .or_else(|| first_turn(request, loads, &keyed, model));
        if let Some(at) = home.or_else(|| moving_turn(request, loads, &keyed, model)) {
            keyed[..=at].rotate_right(1);
        }
        let (all_full, head) = (keyed[0].full, keyed[0].instance);
        let reason = if home.is_some() {
            Reason::Affinity
        } else if all_full {
            Reason::Fallback
        } else if best_match == 0 {
            Reason::Cold
        } else if loads[head].matched_blocks == best_match {
            Reason::CacheHit
        } else {
            Reason::CacheSpread
        };
        // The available ones in their new order, the rest as the ring had them.
        for (place, k) in order.iter_mut().zip(&keyed) {
            *place = k.instance;
        }
        Plan { order, reason }
    }

    fn costs(&self, request: &Request, loads: &[Load]) -> Option<Vec<Cost>> {
        let all: Vec<usize> = (0..loads.len()).collect();
        let up: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&i| loads[i].available)
            .collect();
        let fleet = Fleet::of(
            &up.iter()
                .map(|&i| self.cost_of(request, &loads[i]))
                .collect::<Vec<_>>(),
            up.iter().map(|&i| &loads[i]),
        );
        Some(
            loads
                .iter()
                .map(|l| self.cost_of(request, l).in_fleet(&fleet))
                .collect(),
        )
    }

    fn holds_history(&self, request: &Request, load: &Load) -> bool {
        holds_history(request, load, self.model_for(request))
    }

    fn queued_charge(&self, request: &Request, load: &Load) -> u64 {
        self.model_for(request)
            .queued_charge(request.prompt_tokens, load)
    }
}

#[cfg(test)]
#[path = "longest_tests.rs"]
mod tests;
