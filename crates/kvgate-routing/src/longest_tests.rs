//! Tests of `longest_prefix`'s placement: cost, caps, and where sessions start and move.

use super::*;
use crate::cost::RUNNING_WEIGHT;
use crate::{Home, SESSION_UNIT};

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
        loads[i].recent_sessions = [3, 2, 1, 2][n] * SESSION_UNIT;
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
    loads[walk[2]].recent_sessions = 2 * SESSION_UNIT;
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
    loads[walk[3]].recent_sessions = 5 * SESSION_UNIT;
    let plan = p.plan(&start(Home::Hinted), &loads);
    assert_eq!((plan.order[0], plan.reason), (walk[3], Reason::Affinity));
    // ...unless its queue there outweighs the whole prompt.
    loads[walk[3]].queued_prefill = 8_000;
    assert_eq!(p.plan(&start(Home::Hinted), &loads).order[0], walk[2]);
}

#[test]
fn a_first_question_over_a_document_one_instance_holds_stays_there() {
    let p = policy(2, 64);
    let walk: Vec<usize> = p.ring.walk(42).collect();
    let mut loads = [0, 0].map(Load::with_in_flight);
    // A document as the system prompt (an opening of 500 tokens), held on
    // the busier instance, where more sessions started: a copy elsewhere is
    // within a step (the 256-token guess) of it, but holds none of it.
    loads[walk[0]].matched_blocks = 7;
    loads[walk[0]].queued_prefill = 400;
    loads[walk[0]].recent_sessions = 3 * SESSION_UNIT;
    loads[walk[1]].recent_sessions = SESSION_UNIT;
    let first = Request {
        home: Some(Home::First(500)),
        ..req(520)
    };
    let plan = p.plan(&first, &loads);
    assert_eq!((plan.order[0], plan.reason), (walk[0], Reason::CacheHit));
    // A one-block opening is no reason to stay: the fewest sessions.
    loads[walk[0]].matched_blocks = 1;
    loads[walk[0]].queued_prefill = 0;
    let short = Request {
        home: Some(Home::First(60)),
        ..req(520)
    };
    let plan = p.plan(&short, &loads);
    assert_eq!((plan.order[0], plan.reason), (walk[1], Reason::Affinity));
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
        loads[i].recent_sessions = [3, 3, 2, 1][n] * SESSION_UNIT;
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
    loads[walk[0]].recent_sessions = 4 * SESSION_UNIT;
    assert_eq!(p.plan(&first, &loads).order[0], walk[1]);
}

#[test]
fn one_instance_learning_a_small_step_does_not_narrow_the_first_questions_choice() {
    let p = policy(4, 64);
    let walk: Vec<usize> = p.ring.walk(42).collect();
    let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
    for (n, &i) in walk.iter().enumerate() {
        loads[i].recent_sessions = [5, 2, 1, 3][n] * SESSION_UNIT;
        loads[i].queued_prefill = [0, 100, 150, 0][n];
        loads[i].overhead_tokens = [16, 200, 220, 240][n];
    }
    let first = Request {
        home: Some(Home::First(40)),
        ..req(400)
    };
    // The cheapest, busy with sessions, learned a 16-token step; within
    // the fleet's median step (220) of it, the fewest sessions.
    let plan = p.plan(&first, &loads);
    assert_eq!((plan.order[0], plan.reason), (walk[2], Reason::Affinity));
    // Past the median step, by cost.
    loads[walk[2]].queued_prefill = 300;
    assert_eq!(p.plan(&first, &loads).order[0], walk[1]);
    for &i in &walk[1..] {
        loads[i].queued_prefill = 500;
    }
    assert_eq!(p.plan(&first, &loads).order[0], walk[0]);
}

#[test]
fn a_conversation_moved_off_its_history_goes_where_the_fewest_sessions_started() {
    let p = policy(4, 64);
    let walk: Vec<usize> = p.ring.walk(42).collect();
    let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
    for (n, &i) in walk.iter().enumerate() {
        loads[i].matched_blocks = [10, 1, 1, 1][n];
        loads[i].recent_sessions = [1, 4, 2, 3][n] * SESSION_UNIT;
        loads[i].queued_prefill = [5_000, 0, 100, 200][n];
    }
    let turn = Request {
        opening_tokens: Some(64),
        ..req(1_000)
    };
    // Its holder's queue outweighs the history; of the others within a
    // step (256, the guess) of the cheapest, the fewest sessions.
    let plan = p.plan(&turn, &loads);
    assert_eq!((plan.order[0], plan.reason), (walk[2], Reason::CacheSpread));
    // One past the step is left to cost.
    loads[walk[2]].queued_prefill = 300;
    assert_eq!(p.plan(&turn, &loads).order[0], walk[3]);
    // Nor one dearer than staying: with the holder at 1,000 − 640 + 790, a
    // move to walk[3] (1,136) is cheaper, to walk[2] (1,186) it is not,
    // though both are within a step (256) of the cheapest (936).
    loads[walk[2]].queued_prefill = 250;
    loads[walk[2]].recent_sessions = 0;
    loads[walk[0]].queued_prefill = 790;
    assert_eq!(p.plan(&turn, &loads).order[0], walk[3]);
    loads[walk[0]].queued_prefill = 5_000;
    // Where its holder still leads, it stays; a request that is not a
    // conversation goes by cost alone.
    loads[walk[0]].queued_prefill = 0;
    assert_eq!(p.plan(&turn, &loads).order[0], walk[0]);
    loads[walk[0]].queued_prefill = 5_000;
    assert_eq!(p.plan(&req(1_000), &loads).order[0], walk[1]);
}

#[test]
fn a_hinted_session_moved_by_cost_goes_where_the_fewest_sessions_started() {
    let p = capped(4);
    let walk: Vec<usize> = p.ring.walk(42).collect();
    let mut loads = [0, 0, 0, 0].map(Load::with_in_flight);
    for (n, &i) in walk.iter().enumerate() {
        loads[i].matched_blocks = 10; // the shared prompt
        loads[i].recent_sessions = [1, 3, 1, 2][n] * SESSION_UNIT;
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

#[test]
fn a_first_question_goes_to_the_idle_instance_of_two_that_each_started_a_session_a_moment_apart() {
    let p = policy(2, 64);
    let walk: Vec<usize> = p.ring.walk(42).collect();
    let mut loads = [0, 0].map(Load::with_in_flight);
    // Both started one conversation; the ring's first a moment earlier (a
    // hair more decayed), and it is decoding one request (a running
    // request's weight, well within a step) and was given less work lately.
    loads[walk[0]].recent_sessions = SESSION_UNIT - 1;
    loads[walk[0]].in_flight = 1;
    loads[walk[1]].recent_sessions = SESSION_UNIT;
    loads[walk[1]].recent_work = 10;
    let first = Request {
        home: Some(Home::First(40)),
        ..req(400)
    };
    // The idle one: the cheapest, as cost alone would choose.
    assert_eq!(p.plan(&first, &loads).order[0], walk[1]);
    // A whole session more on the idle one: it goes where fewer started.
    loads[walk[1]].recent_sessions = 2 * SESSION_UNIT;
    let plan = p.plan(&first, &loads);
    assert_eq!((plan.order[0], plan.reason), (walk[0], Reason::Affinity));
}
