//! Where a session's turn leads in `longest_prefix`'s plan, before cost
//! decides: a session's start, a named conversation's home, a first
//! question or a moved conversation placed where the fewest sessions started.

use super::Candidate;
use crate::cost::{self, CostModel};
use crate::{Home, Load, Request, Ring};

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
pub(super) fn session_home(
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
        // where the fewest sessions started lately (to half a session; ties
        // by the work given lately, then the key's ring walk). The session
        // stays where it starts, so what decides its instance's load from
        // here is how many sessions live there, not the queue of this
        // instant.
        Home::Keyed if loads.iter().any(|l| l.matched_blocks > 0) => None,
        Home::Hinted | Home::Keyed => {
            let bound = first.total.saturating_add(request.prompt_tokens);
            keyed
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.full && c.own <= bound)
                .min_by_key(|(_, c)| {
                    let l = loads.get(c.instance).copied().unwrap_or_default();
                    (!l.hosts_session, started(&l), c.work, c.ring)
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
                    let sessions = loads.get(c.instance).map_or(0, started);
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
/// ([`typical_step`]) of the cheapest's, the one where the fewest sessions
/// started lately ([`Load::recent_sessions`], to half a session), then the
/// cheapest now, the least work given, then the ring walk. The cost model
/// cannot tell such instances apart (a step's fixed cost is its resolution), but a
/// conversation stays where it starts: without this a short system prompt
/// held on a few instances (32 tokens, two engine blocks) made them the
/// cheapest for every new conversation, and `kv_aware` left two of four
/// instances idle at one client (`kvgate-loadbench --matrix --workload
/// multi-turn`, capacity unknown), while `longest_prefix`, whose coarser
/// blocks matched none of it, saw ties and spread them. Only instances
/// holding within a step as much of the opening as the most-holding one are
/// candidates: an opening worth more than a step held on some instances only
/// (a long system prompt, a document) leads by cost even while its holder
/// is busy. Without that, real vLLM's first pass (`scripts/vllm_bench.py`,
/// 8 documents as system prompts, 2 engines) sent one first question a pass
/// to the engine without its document, when the holder's queue brought it
/// within the 256-token guessed step: 59.0% of prompt tokens cached against
/// hashing's 62.9%.
pub(super) fn first_turn(
    request: &Request,
    loads: &[Load],
    keyed: &[Candidate],
    model: CostModel,
) -> Option<usize> {
    let Some(Home::First(opening)) = request.home else {
        return None;
    };
    let tokens = |c: &Candidate| {
        let blocks = loads.get(c.instance).map_or(0, |l| l.matched_blocks) as u64;
        blocks.saturating_mul(model.block_tokens)
    };
    let past_opening = opening.saturating_add(model.block_tokens);
    if keyed.iter().any(|c| tokens(c) >= past_opening) {
        return None;
    }
    let first = keyed.first().filter(|c| !c.full)?;
    let step = typical_step(loads, keyed);
    let bound = first.total.saturating_add(step);
    // Only instances holding as much of the opening as any, within a step:
    // an opening worth more than a step (a document in the system prompt)
    // that one instance holds stays a reason to go there, however busy it is.
    let most = keyed.iter().map(tokens).max().unwrap_or(0);
    keyed
        .iter()
        .enumerate()
        .take_while(|(_, c)| !c.full && c.total <= bound)
        .filter(|(_, c)| most.saturating_sub(tokens(c)) <= step)
        .min_by_key(|(_, c)| start_order(loads, c))
        .map(|(at, _)| at)
        .filter(|&at| at > 0)
}

/// Where in `keyed` a conversation's turn goes when the cost model takes it
/// off the instances holding its history (a queue there outweighs
/// recomputing it): of the others within one engine step ([`typical_step`])
/// of the cheapest and cheaper than staying on an open holder, the one where
/// the fewest sessions started lately, as a first question starts
/// ([`first_turn`]); the conversation lives where it moves. Without it every move went to the one instance the cost model
/// ranked cheapest, most often the one that learned the smallest step: one
/// took 26 of 54 moves and 18.1% of the requests over 7 instances
/// (`kvgate-loadbench --workload multi-turn`). Hinted sessions move by
/// [`Home::Lives`].
pub(super) fn moving_turn(
    request: &Request,
    loads: &[Load],
    keyed: &[Candidate],
    model: CostModel,
) -> Option<usize> {
    if matches!(request.home, Some(Home::Hinted | Home::Keyed | Home::Lives)) {
        return None;
    }
    let history = |c: &Candidate| {
        loads
            .get(c.instance)
            .is_some_and(|l| holds_history(request, l, model))
    };
    let first = keyed.first().filter(|c| !c.full && !history(c))?;
    if !keyed.iter().any(history) {
        return None;
    }
    // Cheaper than staying, where a holder is open: under its total.
    let stay = keyed
        .iter()
        .filter(|c| !c.full && history(c))
        .map(|c| c.total)
        .min()
        .unwrap_or(u64::MAX);
    let bound = first
        .total
        .saturating_add(typical_step(loads, keyed))
        .min(stay.saturating_sub(1));
    keyed
        .iter()
        .enumerate()
        .take_while(|(_, c)| !c.full && c.total <= bound)
        .filter(|(_, c)| !history(c))
        .min_by_key(|(_, c)| start_order(loads, c))
        .map(|(at, _)| at)
        .filter(|&at| at > 0)
}

/// Sessions started lately on `l`'s instance, to the nearest half session:
/// the order of where a session starts. The count decays (a minute's
/// half-life), so two instances that each started one session a moment
/// apart differ by a thousandth of one; compared as they are, the one that
/// started its session first counted as having started fewer, however busy
/// it was. Real vLLM's first pass put two first questions in a row on the
/// engine already decoding, by 90 ms of decay, while the other stood idle
/// (`scripts/vllm_bench.py`, round 2): one engine took five documents into
/// a cache for four and evicted one. Within half a session, the cheaper
/// instance now, then the work given lately, then the ring.
fn started(l: &Load) -> u64 {
    const HALF: u64 = crate::SESSION_UNIT / 2;
    l.recent_sessions.saturating_add(HALF / 2) / HALF
}

/// Where an unnamed conversation starts, or goes when moved off its history,
/// among the instances the cost model cannot tell apart: the fewest sessions
/// started lately ([`started`]), then the cheapest now, the least work given
/// lately, the ring.
fn start_order(loads: &[Load], c: &Candidate) -> (u64, u64, u64, usize) {
    let sessions = loads.get(c.instance).map_or(0, started);
    (sessions, c.total, c.work, c.ring)
}

/// The open instances' median learned step ([`cost::overhead`]): the
/// resolution of the cost model across the fleet. Not the cheapest's own:
/// on an engine that batches its queue's prefills, a busier instance shows a
/// smaller step, is charged less for its queue, and with its own step as the
/// bound would take every new conversation alone. The simulator showed it:
/// one instance learned 16 tokens against 170–240 elsewhere and started 70
/// of 400 conversations against 55 on each other
/// (`kvgate-loadbench --workload multi-turn`).
fn typical_step(loads: &[Load], keyed: &[Candidate]) -> u64 {
    let mut steps: Vec<u64> = keyed
        .iter()
        .filter(|c| !c.full)
        .filter_map(|c| loads.get(c.instance).map(cost::overhead))
        .collect();
    if steps.is_empty() {
        return 0;
    }
    let middle = steps.len() / 2;
    *steps.select_nth_unstable(middle).1
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
pub(super) fn holds_history(request: &Request, load: &Load, model: CostModel) -> bool {
    request.opening_tokens.is_some_and(|opening| {
        (load.matched_blocks as u64).saturating_mul(model.block_tokens)
            >= opening.saturating_add(model.block_tokens)
    })
}
