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
//! lately ([`Load::recent_sessions`], a minute's half-life; ties by the work
//! given lately, then the ring walk), or, for a later first turn of a hinted
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
//! step of the cheapest ([`first_turn`]).
//!
//! The least [`Cost::total`] leads; among equal costs (a cold prefix on an
//! idle fleet) the instance given the least work lately
//! ([`Load::recent_work`]), so a few hot keys cannot leave an instance idle;
//! remaining ties go by the key's ring walk. The rest follow by cost as
//! failover. When every instance is full the least costly one leads anyway
//! (reason `fallback`). O(instances · log instances).

use super::cost::{self, Fleet};
use super::{
    Cost, CostModel, Home, Load, Plan, Policy, Reason, Request, Ring, balance_cap, ring_order,
};

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

/// Where in `keyed` (sorted by cost) a session's home instance stands, when
/// it should lead: for a hinted or keyed first turn, the instance where the
/// fewest sessions started lately; for a named conversation, the first of its
/// name's ring walk under the caps; either way one whose own cost is at most
/// the whole prompt more than the cheapest's total. (A hinted session the
/// cost model moves, [`Home::Lives`], goes where the fewest sessions started
/// of the instances cheaper than staying.) What
/// a copy duplicates for the fleet is not counted against it: a session's
/// start is where the shared prompt gets its next holder, once. A named
/// conversation's home leads only while the instance it would otherwise go
/// to (the cheapest) has more requests in flight, and only if the home holds
/// the conversation's opening but none of its history, or nothing at all:
/// the move recomputes the turns already answered, which buys nothing while
/// the fleet is not busy; a home holding its history is where it was before
/// the cost model moved it on, and is not taken back to; and a copy of a
/// shared prompt on an instance that holds others evicts them
/// (conversations over three system prompts in small caches,
/// `kvgate-loadbench --matrix`: without these conditions, 2–7 points of
/// cached tokens lost and P90 TTFT up to 4.7× where the gateway did not know
/// the caches' size). The named walk maps instances to candidates once, so
/// a walk past many full instances stays O(instances).
fn session_home(
    ring: &Ring,
    request: &Request,
    loads: &[Load],
    keyed: &[Candidate],
) -> Option<usize> {
    let home = request.home?;
    let first = keyed.first().filter(|c| !c.full)?;
    let at = match home {
        // A session's first turn: of the instances within one prompt of the
        // cheapest, the one the session already lives on (a later first
        // turn of a hinted session: a sub-agent, a new task), else the one
        // where the fewest sessions started lately (ties by the work given
        // lately, then the key's ring walk). The session stays where it
        // starts, so what decides its instance's load from here is how many
        // sessions live there, not the queue of this instant.
        Home::Keyed if loads.iter().any(|l| l.matched_blocks > 0) => None,
        Home::Hinted | Home::Keyed => {
            let bound = first.total.saturating_add(request.prompt_tokens);
            keyed
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.full && c.own <= bound)
                .min_by_key(|(_, c)| {
                    let l = loads.get(c.instance).copied().unwrap_or_default();
                    (!l.hosts_session, l.recent_sessions, c.work, c.ring)
                })
                .map(|(at, _)| at)
        }
        // A hinted session the cost model moves (its host no longer leads)
        // starts afresh elsewhere: of the others cheaper than staying (any
        // within its prompt of the cheapest if its host is unavailable),
        // the one where the fewest sessions started lately.
        Home::Lives => {
            let hosts = |c: &Candidate| loads.get(c.instance).is_some_and(|l| l.hosts_session);
            if !loads.iter().any(|l| l.hosts_session) || hosts(first) {
                return None;
            }
            let bound = keyed.iter().find(|c| hosts(c)).map_or(
                first
                    .total
                    .saturating_add(request.prompt_tokens)
                    .saturating_add(1),
                |h| h.total,
            );
            keyed
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.full && c.total < bound && !hosts(c))
                .min_by_key(|(_, c)| {
                    let sessions = loads.get(c.instance).map_or(0, |l| l.recent_sessions);
                    (sessions, c.work, c.ring)
                })
                .map(|(at, _)| at)
        }
        // A conversation's own key walks its own ring, as far as its first
        // instance under the caps (most often its first).
        Home::Named(key) => named_walk(ring, key, loads.len(), keyed),
        // Placed by `first_turn`, once no other home leads.
        Home::First(_) => None,
    }?;
    let c = keyed.get(at)?;
    let busier = |c: &Candidate| loads.get(c.instance).map_or(0, |l| l.in_flight);
    // A named conversation's home leads only while the cheapest is busier.
    let leads = !matches!(home, Home::Named(_)) || (busier(first) > busier(c) && c.opens);
    (at > 0 && leads && c.own <= first.total.saturating_add(request.prompt_tokens)).then_some(at)
}

/// Where in `keyed` a chat or Messages conversation's first question leads
/// when nothing names it ([`Home::First`]) and no instance holds more of it
/// than its opening (by a block; a question asked before, or a document in
/// it, goes by cost): of the candidates whose total is within one engine step
/// ([`cost::overhead`] of the cheapest) of the cheapest's, the one where the
/// fewest sessions started lately ([`Load::recent_sessions`]), then the
/// least work given, then the ring walk. The cost model cannot tell such
/// instances apart (a step's fixed cost is its resolution), but a
/// conversation stays where it starts: without this a short system prompt
/// held on a few instances (32 tokens, two engine blocks) made them the
/// cheapest for every new conversation, and `kv_aware` left two of four
/// instances idle at one client (`kvgate-loadbench --matrix --workload
/// multi-turn`, capacity unknown), while `longest_prefix`, whose coarser
/// blocks matched none of it, saw ties and spread them. An opening worth
/// more than a step (a long system prompt held on some instances only)
/// still leads by cost.
fn first_turn(
    request: &Request,
    loads: &[Load],
    keyed: &[Candidate],
    model: CostModel,
) -> Option<usize> {
    let Some(Home::First(opening)) = request.home else {
        return None;
    };
    let past_opening = opening.saturating_add(model.block_tokens);
    let held = |c: &Candidate| {
        let blocks = loads.get(c.instance).map_or(0, |l| l.matched_blocks) as u64;
        blocks.saturating_mul(model.block_tokens) >= past_opening
    };
    if keyed.iter().any(held) {
        return None;
    }
    let first = keyed.first().filter(|c| !c.full)?;
    let step = loads.get(first.instance).map_or(0, cost::overhead);
    let bound = first.total.saturating_add(step);
    keyed
        .iter()
        .enumerate()
        .take_while(|(_, c)| !c.full && c.total <= bound)
        .min_by_key(|(_, c)| {
            let sessions = loads.get(c.instance).map_or(0, |l| l.recent_sessions);
            (sessions, c.work, c.ring)
        })
        .map(|(at, _)| at)
        .filter(|&at| at > 0)
}

/// The first candidate under the caps along a conversation's own ring walk.
/// Maps instances to candidates once, so a walk past many full instances
/// stays O(instances).
fn named_walk(ring: &Ring, key: u64, instances: usize, keyed: &[Candidate]) -> Option<usize> {
    let mut at_of = vec![usize::MAX; instances];
    for (at, c) in keyed.iter().enumerate() {
        if let Some(slot) = at_of.get_mut(c.instance) {
            *slot = at;
        }
    }
    ring.walk(key)
        .filter_map(|i| at_of.get(i).copied())
        .find(|&at| keyed.get(at).is_some_and(|c| !c.full))
}

/// Whether `load`'s instance holds `request`'s conversation past its opening
/// by a block at least: history only its earlier turns put there. The
/// opening's tokens are estimated from its characters at the engine's learned
/// density; a wider margin (an eighth of the opening was tried) kept a
/// session's first turns under the cap and moved them (coding agents: 10–20
/// moves against 4–7 in `kvgate-loadbench --agents`).
fn holds_history(request: &Request, load: &Load, model: CostModel) -> bool {
    request.opening_tokens.is_some_and(|opening| {
        (load.matched_blocks as u64).saturating_mul(model.block_tokens)
            >= opening.saturating_add(model.block_tokens)
    })
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
        if let Some(at) = home {
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

    fn queued_charge(&self, request: &Request, load: &Load) -> u64 {
        self.model_for(request)
            .queued_charge(request.prompt_tokens, load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::RUNNING_WEIGHT;

    fn policy(n: usize, threshold: usize) -> LongestPrefix {
        let ids: Vec<String> = (0..n).map(|i| format!("i{i}")).collect();
        LongestPrefix::new(
            Ring::new(&ids, 64),
            threshold,
            None,
            CostModel::for_block_chars(256),
        )
    }

    fn req(prompt_tokens: u64) -> Request {
        Request {
            key: 42,
            prompt_tokens,
            ..Request::default()
        }
    }

    /// A `balance_factor` 1.0 policy over `n` instances.
    fn capped(n: usize) -> LongestPrefix {
        let ids: Vec<String> = (0..n).map(|i| format!("i{i}")).collect();
        LongestPrefix::new(
            Ring::new(&ids, 64),
            64,
            Some(1.0),
            CostModel::for_block_chars(256),
        )
    }

    #[test]
    fn the_cap_spreads_a_shared_opening_but_keeps_a_conversation_s_own_history() {
        let p = capped(3);
        // Three requests in flight on instance 0, none elsewhere: the cap is
        // ⌈1.0·4/3⌉ + 1 = 3, so instance 0 is at it.
        let mut loads = [3, 0, 0].map(Load::with_in_flight);
        // It holds 40,000 tokens of this 41,000-token prompt (64 a block);
        // instance 1 holds the 10,000-token opening.
        loads[0].matched_blocks = 625;
        loads[1].matched_blocks = 156;
        let new_turn = Request {
            opening_tokens: Some(10_300),
            ..req(41_000)
        };
        let plan = p.plan(&new_turn, &loads);
        assert_eq!((plan.order[0], plan.reason), (0, Reason::CacheHit));
        // A first question over the same opening is capped off as before: the
        // opening is what replicates.
        let first = Request {
            opening_tokens: None,
            ..req(10_300)
        };
        loads[0].matched_blocks = 160;
        let plan = p.plan(&first, &loads);
        assert_eq!((plan.order[0], plan.reason), (1, Reason::CacheSpread));
        // So is a continuation whose holder has only its opening.
        let short = Request {
            opening_tokens: Some(10_300),
            ..req(10_600)
        };
        assert_eq!(p.plan(&short, &loads).order[0], 1);
        // Past the opening by less than a block (10,304 tokens held) is not
        // history; by a block (10,368) it is.
        loads[0].matched_blocks = 161;
        let longer = Request {
            opening_tokens: Some(10_300),
            ..req(12_000)
        };
        assert_eq!(p.plan(&longer, &loads).order[0], 1);
        loads[0].matched_blocks = 162;
        assert_eq!(p.plan(&longer, &loads).order[0], 0);
        // And the threshold binds whatever is held.
        let p = LongestPrefix::new(
            Ring::new(&["a".into(), "b".into(), "c".into()], 64),
            3,
            Some(1.0),
            CostModel::for_block_chars(256),
        );
        loads[0].matched_blocks = 625;
        assert_eq!(p.plan(&new_turn, &loads).order[0], 1);
    }

    #[test]
    fn a_session_starts_on_its_ring_instance_and_goes_on_where_its_history_is() {
        let p = capped(4);
        let walk: Vec<usize> = p.ring.walk(42).collect();
        let (home, holder) = (walk[0], walk[3]);
        // The shared system prompt (3,000 tokens) is held by the last of the
        // key's ring walk, busy with one request.
        let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
        loads[holder] = Load {
            matched_blocks: 47,
            ..Load::with_in_flight(1)
        };
        let start = Request {
            home: Some(Home::Hinted),
            ..req(3_200)
        };
        let plan = p.plan(&start, &loads);
        assert_eq!((plan.order[0], plan.reason), (home, Reason::Affinity));
        assert_eq!(plan.order[1], holder, "the rest by cost: {plan:?}");
        // Without a session hint the holder leads, by cost.
        let plain = p.plan(&req(3_200), &loads);
        assert_eq!((plain.order[0], plain.reason), (holder, Reason::CacheHit));
        // A later turn, given no home, goes by cost: its history is where it is.
        let later = Request {
            opening_tokens: Some(3_000),
            home: None,
            ..start
        };
        assert_eq!(p.plan(&later, &loads).order[0], holder);
        // A conversation's home key is walked on its own, whatever the key.
        let other = (1..1_000u64)
            .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .find(|&k| p.ring.walk(k).next() == Some(walk[1]))
            .unwrap();
        let named = Request {
            home: Some(Home::Named(other)),
            opening_tokens: Some(3_000),
            ..start
        };
        let plan = p.plan(&named, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[1], Reason::Affinity));
        // But only while the instance it would otherwise go to is busier.
        loads[holder].in_flight = 0;
        let plan = p.plan(&named, &loads);
        assert_eq!((plan.order[0], plan.reason), (holder, Reason::CacheHit));
        loads[holder].in_flight = 1;
        // And only to a home holding its opening, or nothing at all.
        loads[walk[1]].cache_fill = 100;
        assert_eq!(p.plan(&named, &loads).order[0], holder);
        loads[walk[1]].matched_blocks = 47;
        assert_eq!(p.plan(&named, &loads).order[0], walk[1]);
        // 7/8 of the estimated opening is enough (2,625 of 3,000 tokens),
        // one partial block short of it allowed.
        loads[walk[1]].matched_blocks = 41;
        assert_eq!(p.plan(&named, &loads).order[0], walk[1]);
        loads[walk[1]].matched_blocks = 40;
        assert_eq!(p.plan(&named, &loads).order[0], holder);
        // A home holding the conversation past its opening is where the cost
        // model moved it away from: it is not taken back there.
        loads[walk[1]].matched_blocks = 49;
        loads[holder].matched_blocks = 50;
        let plan = p.plan(&named, &loads);
        assert_eq!((plan.order[0], plan.reason), (holder, Reason::CacheHit));
        loads[holder].matched_blocks = 47;
        loads[walk[1]] = Load::with_in_flight(0);
        // A ring instance at the cap gives way to the next one of the walk.
        loads[home] = Load::with_in_flight(3);
        let plan = p.plan(&start, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[1], Reason::Affinity));
        // One whose queue costs more than the whole prompt again does not lead.
        loads[home] = Load::with_in_flight(0);
        loads[home].queued_prefill = 4_000;
        loads[walk[1]].queued_prefill = 4_000;
        loads[walk[2]].queued_prefill = 4_000;
        assert_eq!(p.plan(&start, &loads).order[0], holder);
    }

    #[test]
    fn a_session_starts_where_the_fewest_conversations_started_lately() {
        let p = capped(4);
        let walk: Vec<usize> = p.ring.walk(42).collect();
        let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
        for (n, &i) in walk.iter().enumerate() {
            loads[i].recent_sessions = [3, 2, 1, 2][n];
        }
        let start = |home| Request {
            home: Some(home),
            ..req(3_200)
        };
        for home in [Home::Hinted, Home::Keyed] {
            let plan = p.plan(&start(home), &loads);
            assert_eq!((plan.order[0], plan.reason), (walk[2], Reason::Affinity));
        }
        // Equal counts: the one given the least work lately, then the walk.
        loads[walk[2]].recent_sessions = 2;
        loads[walk[1]].recent_work = 900;
        assert_eq!(p.plan(&start(Home::Hinted), &loads).order[0], walk[2]);
        loads[walk[2]].recent_work = 900;
        loads[walk[3]].recent_work = 900;
        assert_eq!(p.plan(&start(Home::Hinted), &loads).order[0], walk[1]);
        // Not one whose queue costs more than the whole prompt over the
        // cheapest's.
        loads[walk[1]].queued_prefill = 4_000;
        assert_eq!(p.plan(&start(Home::Hinted), &loads).order[0], walk[2]);
        // A keyed first turn whose partition is held somewhere goes by cost.
        loads[walk[0]].matched_blocks = 20;
        let plan = p.plan(&start(Home::Keyed), &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[0], Reason::CacheHit));
        let plan = p.plan(&start(Home::Hinted), &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[2], Reason::Affinity));
        // A hinted session's later first turn (a sub-agent, a new task)
        // returns where the session lives, though more started there...
        loads[walk[3]].hosts_session = true;
        loads[walk[3]].recent_sessions = 5;
        let plan = p.plan(&start(Home::Hinted), &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[3], Reason::Affinity));
        // ...unless its queue there outweighs the whole prompt.
        loads[walk[3]].queued_prefill = 8_000;
        assert_eq!(p.plan(&start(Home::Hinted), &loads).order[0], walk[2]);
    }

    #[test]
    fn a_first_question_starts_where_the_fewest_sessions_started_within_a_step() {
        let p = policy(4, 64);
        let walk: Vec<usize> = p.ring.walk(42).collect();
        let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
        // A short system prompt (estimated at 150 tokens; two blocks of
        // 64) held where the most sessions started.
        for (n, &i) in walk.iter().enumerate() {
            loads[i].matched_blocks = [2, 2, 0, 0][n];
            loads[i].recent_sessions = [3, 3, 2, 1][n];
        }
        let first = Request {
            home: Some(Home::First(150)),
            ..req(400)
        };
        // By cost alone the first holder leads, and would take every
        // conversation that opens with that prompt.
        let plan = p.plan(&req(400), &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[0], Reason::CacheHit));
        // As a conversation's first question: the fewest sessions of those
        // within one step (256 tokens, the guess) of the cheapest.
        let plan = p.plan(&first, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[3], Reason::Affinity));
        assert_eq!(plan.order[1], walk[0], "the rest by cost: {plan:?}");
        // Not one whose queue puts it more than a step over the cheapest.
        loads[walk[3]].queued_prefill = 300;
        assert_eq!(p.plan(&first, &loads).order[0], walk[2]);
        // A holder of more than its opening (the question asked before, a
        // document in it) keeps it, by cost, though a step would cover it.
        loads[walk[1]].matched_blocks = 4;
        let plan = p.plan(&first, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[1], Reason::CacheHit));
        loads[walk[1]].matched_blocks = 3;
        assert_eq!(
            p.plan(&first, &loads).order[0],
            walk[2],
            "within a block of it"
        );
        loads[walk[1]].matched_blocks = 2;
        // An engine whose learned step is cheaper than the prompt held: the
        // holders lead by cost, the first of them by work, then the walk.
        for l in &mut loads {
            l.overhead_tokens = 64;
        }
        let plan = p.plan(&first, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[0], Reason::CacheHit));
        loads[walk[0]].recent_sessions = 4;
        assert_eq!(p.plan(&first, &loads).order[0], walk[1]);
    }

    #[test]
    fn a_hinted_session_moved_by_cost_goes_where_the_fewest_sessions_started() {
        let p = capped(4);
        let walk: Vec<usize> = p.ring.walk(42).collect();
        let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
        for (n, &i) in walk.iter().enumerate() {
            loads[i].matched_blocks = 10; // the shared prompt
            loads[i].recent_sessions = [1, 3, 1, 2][n];
            loads[i].recent_work = [0, 0, 500, 500][n];
        }
        // Its host holds its history, but a queue there outweighs it.
        loads[walk[0]].hosts_session = true;
        loads[walk[0]].matched_blocks = 14;
        loads[walk[0]].queued_prefill = 20_000;
        let turn = Request {
            home: Some(Home::Lives),
            opening_tokens: Some(600),
            ..req(1_000)
        };
        // By cost alone, the least worked of the others; as a session moving,
        // the one with the fewest sessions.
        let plan = p.plan(&turn, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[2], Reason::Affinity));
        // Never to one that costs more than staying: cold, walk[2] would
        // recompute the shared prompt too.
        loads[walk[2]].matched_blocks = 0;
        loads[walk[0]].queued_prefill = 500;
        let plan = p.plan(&turn, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[3], Reason::Affinity));
        loads[walk[2]].matched_blocks = 10;
        // Where its host still leads, it stays.
        loads[walk[0]].queued_prefill = 0;
        let plan = p.plan(&turn, &loads);
        assert_eq!((plan.order[0], plan.reason), (walk[0], Reason::CacheHit));
        // With no host known (another replica served it), by cost.
        loads[walk[0]].queued_prefill = 20_000;
        loads[walk[0]].hosts_session = false;
        assert_eq!(p.plan(&turn, &loads).order[0], walk[1]);
    }

    #[test]
    fn a_conversation_s_holder_past_the_cap_is_left_when_its_queue_outweighs_the_history() {
        let p = capped(3);
        let mut loads = [3, 0, 0].map(Load::with_in_flight);
        loads[0].matched_blocks = 47; // 3,008 of a 4,000-token conversation
        let turn = Request {
            opening_tokens: Some(500),
            ..req(4_000)
        };
        // A queue under the 3,000 tokens it would recompute elsewhere: it stays.
        loads[0].queued_prefill = 1_000;
        let plan = p.plan(&turn, &loads);
        assert_eq!((plan.order[0], plan.reason), (0, Reason::CacheHit));
        loads[0].queued_prefill = 6_000;
        let plan = p.plan(&turn, &loads);
        assert_ne!(plan.order[0], 0);
        assert_eq!(plan.reason, Reason::CacheSpread);
    }

    #[test]
    fn cold_prompt_on_idle_fleet_follows_the_ring() {
        let p = policy(5, 8);
        let plan = p.plan(&req(1000), &[Load::with_in_flight(0); 5]);
        assert_eq!(plan.reason, Reason::Cold);
        assert_eq!(plan.order, p.ring.walk(42).collect::<Vec<_>>());
    }

    #[test]
    fn cold_prompt_goes_to_the_least_loaded() {
        let p = policy(3, 8);
        let loads = [3, 1, 2].map(Load::with_in_flight);
        let plan = p.plan(&req(1000), &loads);
        assert_eq!((plan.order[0], plan.reason), (1, Reason::Cold));
    }

    #[test]
    fn the_holder_wins_until_its_queue_outweighs_the_prefix() {
        let p = policy(3, 64);
        let mut loads = [0, 0, 0].map(Load::with_in_flight);
        loads[2].matched_blocks = 100; // 6,400 tokens of an 8,000-token prompt
        let plan = p.plan(&req(8000), &loads);
        assert_eq!((plan.order[0], plan.reason), (2, Reason::CacheHit));
        // Queued prefill on the holder beyond what recomputing costs: spread.
        loads[2].queued_prefill = 7000;
        let plan = p.plan(&req(8000), &loads);
        assert_eq!(plan.reason, Reason::CacheSpread);
        assert_ne!(plan.order[0], 2);
        assert_eq!(plan.order[2], 2, "the busy holder is still a failover");
    }

    #[test]
    fn under_cache_pressure_a_prefix_leaves_its_holder_only_for_twice_the_recompute() {
        let p = policy(3, 64);
        let mut loads = [0, 0, 0].map(Load::with_in_flight);
        for l in &mut loads {
            l.cache_fill = crate::cost::FULL;
        }
        loads[2].matched_blocks = 100; // 6,400 of 8,000 tokens
        // A queue the wait-only model would leave (7,000 > 6,400 to recompute).
        loads[2].queued_prefill = 7000;
        let plan = p.plan(&req(8000), &loads);
        assert_eq!((plan.order[0], plan.reason), (2, Reason::CacheHit));
        // Beyond the recompute and what the copy would evict: spread.
        loads[2].queued_prefill = 14_000;
        let plan = p.plan(&req(8000), &loads);
        assert_eq!(plan.reason, Reason::CacheSpread);
        // With room in the other caches, copying evicts nothing.
        loads[2].queued_prefill = 7000;
        loads[0].cache_fill = 0;
        let plan = p.plan(&req(8000), &loads);
        assert_eq!((plan.order[0], plan.reason), (0, Reason::CacheSpread));
    }

    #[test]
    fn equal_costs_go_to_the_instance_given_least_work_lately() {
        let p = policy(4, 64);
        let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
        let ring_first = p.ring.walk(42).next().unwrap_or(0);
        loads[ring_first].recent_work = 5000;
        let least = (ring_first + 1) % 4;
        for (i, l) in loads.iter_mut().enumerate() {
            if i != ring_first && i != least {
                l.recent_work = 3000;
            }
        }
        let plan = p.plan(&req(1000), &loads);
        assert_eq!((plan.order[0], plan.reason), (least, Reason::Cold));
    }

    #[test]
    fn a_second_request_joins_its_prefix_being_prefilled() {
        // A fresh fleet, overhead still the guess: the first request for a
        // 767-token document is prefilling on 0 when the second arrives.
        let p = policy(2, 8);
        let holder = Load {
            queued_prefill: 767 + 256,
            waiting: 1,
            matched_blocks: 11,
            cache_fill: 275,
            prefilling: true,
            ..Load::with_in_flight(1)
        };
        let loads = [holder, Load::with_in_flight(0)];
        let plan = p.plan(&req(767), &loads);
        assert_eq!((plan.order[0], plan.reason), (0, Reason::CacheHit));
        let costs = p.costs(&req(767), &loads).unwrap_or_default();
        assert_eq!(costs[0].queued_tokens, 767 + RUNNING_WEIGHT, "{costs:?}");
        // Behind a prefill of blocks already cached (another request's
        // hit), the step ahead is one more to wait: 1,135 against 1,119.
        let settled = [
            Load {
                prefilling: false,
                ..holder
            },
            loads[1],
        ];
        assert_eq!(p.plan(&req(767), &settled).order[0], 1);
    }

    #[test]
    fn a_partial_holder_is_preferred_when_spreading() {
        let p = policy(3, 64);
        let mut loads = [0, 0, 0].map(Load::with_in_flight);
        loads[0].matched_blocks = 100;
        loads[0].queued_prefill = 20_000;
        loads[1].matched_blocks = 50;
        let plan = p.plan(&req(8000), &loads);
        assert_eq!((plan.order[0], plan.reason), (1, Reason::CacheSpread));
    }

    #[test]
    fn threshold_excludes_and_all_full_falls_back_to_cheapest() {
        let p = policy(2, 2);
        let mut loads = [2, 0].map(Load::with_in_flight);
        loads[0].matched_blocks = 100;
        assert_eq!(p.plan(&req(8000), &loads).order[0], 1);
        let mut loads = [2, 3].map(Load::with_in_flight);
        loads[1].matched_blocks = 100;
        let plan = p.plan(&req(8000), &loads);
        assert_eq!((plan.order[0], plan.reason), (1, Reason::Fallback));
    }

    #[test]
    fn unavailable_instances_go_last_and_none_is_last_resort() {
        let p = policy(3, 8);
        let mut loads = [0, 0, 0].map(Load::with_in_flight);
        loads[1].matched_blocks = 100;
        loads[1].available = false;
        let plan = p.plan(&req(8000), &loads);
        assert_eq!(plan.reason, Reason::Cold);
        assert_eq!(plan.order[2], 1);
        for l in &mut loads {
            l.available = false;
        }
        assert_eq!(p.plan(&req(8000), &loads).reason, Reason::LastResort);
    }

    #[test]
    fn a_learned_block_size_values_matched_blocks_in_the_engines_tokens() {
        let p = policy(2, 64);
        let mut loads = [0, 0].map(Load::with_in_flight);
        loads[0].matched_blocks = 10;
        loads[0].queued_prefill = 1000;
        // 64 tokens a block (4 characters a token): 640 cached, not worth the queue.
        assert_eq!(p.plan(&req(2000), &loads).order[0], 1);
        // The engine counts 2 characters a token: 1,280 cached, worth it.
        let learned = Request {
            block_tokens: 128,
            ..req(2000)
        };
        let plan = p.plan(&learned, &loads);
        assert_eq!((plan.order[0], plan.reason), (0, Reason::CacheHit));
        assert_eq!(
            p.queued_charge(&learned, &loads[0]),
            720 + crate::cost::REQUEST_OVERHEAD
        );
    }

    #[test]
    fn costs_and_charges_follow_the_model() {
        let p = policy(2, 8);
        let mut loads = [1, 0].map(Load::with_in_flight);
        loads[0].matched_blocks = 10;
        let costs = p.costs(&req(1000), &loads).unwrap_or_default();
        assert_eq!(costs[0].total, 360 + RUNNING_WEIGHT);
        // Recomputing the 640 held tokens, with one instance of two busy.
        assert_eq!(costs[1].duplicated_tokens, 320);
        assert_eq!(costs[1].total, 1000 + 320);
        assert_eq!(
            p.queued_charge(&req(1000), &loads[0]),
            360 + crate::cost::REQUEST_OVERHEAD
        );
    }

    #[test]
    fn an_idle_cold_fleet_is_planned_in_the_key_s_ring_order() {
        // Every cost ties, so the plan is the key's walk round the ring.
        let p = policy(32, 3);
        let loads = vec![Load::with_in_flight(0); 32];
        for key in [1, 99, 4242, u64::MAX] {
            let r = Request { key, ..req(2000) };
            let plan = p.plan(&r, &loads);
            assert_eq!(plan.order, p.ring.walk(key).collect::<Vec<_>>());
            assert_eq!(plan.reason, Reason::Cold);
        }
    }

    /// A load from a few values each, so that costs often tie.
    fn tied_load() -> impl proptest::strategy::Strategy<Value = Load> {
        use proptest::prelude::*;
        (
            0usize..4,
            0usize..3,
            prop_oneof![Just(0u64), Just(1000)],
            0usize..2,
            prop_oneof![Just(0u16), Just(1000)],
            0u64..3,
            proptest::bool::weighted(0.9),
        )
            .prop_map(
                |(in_flight, matched, queued, waiting, fill, work, available)| Load {
                    in_flight,
                    matched_blocks: matched,
                    queued_prefill: queued,
                    waiting,
                    cache_fill: fill,
                    recent_work: work,
                    available,
                    ..Load::default()
                },
            )
    }

    proptest::proptest! {
        /// The plan leads with what `explain` shows as cheapest: its order
        /// is the available instances by (not full, the costs `costs`
        /// reports, recent work), ties in ring order, then the rest.
        #[test]
        fn the_plan_orders_by_the_costs_explain_shows(
            loads in proptest::collection::vec(tied_load(), 1..48),
            key in 0u64..1_000_000,
            prompt in 1u64..4000,
        ) {
            let p = policy(loads.len(), 3);
            let r = Request { key, ..req(prompt) };
            let plan = p.plan(&r, &loads);
            let costs = p.costs(&r, &loads).unwrap_or_default();
            let walk: Vec<usize> = p.ring.walk(key).collect();
            let limit = 3; // the threshold: no balance factor
            let up = |&i: &usize| loads[i].available;
            let mut want: Vec<usize> = walk.iter().copied().filter(up).collect();
            want.sort_by_key(|&i| {
                (loads[i].in_flight >= limit, costs[i].total, loads[i].recent_work)
            });
            want.extend(walk.iter().copied().filter(|i| !up(i)));
            proptest::prop_assert_eq!(plan.order, want);
        }
    }
}
