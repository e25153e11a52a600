//! Sessions under `longest_prefix`. A session's first turn (a Messages
//! `metadata.user_id`, or a chat `prompt_cache_key` nothing yet holds) starts
//! where the fewest sessions started lately, so sessions spread by count, and
//! stays there past the balance cap until that instance's queue outweighs
//! recomputing the session. Chat conversations over one shared opening, which
//! name no session, spread from their second turn: each goes to the ring
//! instance its opening and first question name, and stays there.

use serde_json::{Value, json};

use super::cache_aware::{MODEL, at, explain as explain_chat, ids, request, text, upstreams, yaml};
use crate::common::*;
use kvgate::fleet::recent_work::SESSION_HALF_LIFE_MS;

const ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"cache-model","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":2}}"#;

/// A Messages body: `system`, then each (question, answer), then `last`.
fn body(system: &str, session: &str, turns: &[(String, String)], last: &str) -> Value {
    let mut messages = Vec::new();
    for (q, a) in turns {
        messages.push(json!({"role": "user", "content": q}));
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": a}]}));
    }
    messages.push(json!({"role": "user", "content": last}));
    json!({
        "model": MODEL, "max_tokens": 16, "system": system,
        "metadata": {"user_id": session}, "messages": messages,
    })
}

async fn explain(gw: &Gateway, b: &Value) -> Value {
    let r = gw.explain("/v1/messages", None, b).await;
    assert_eq!(r.status(), 200);
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

fn post(gw: &Gateway, b: &Value) -> reqwest::RequestBuilder {
    client()
        .post(gw.url("/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(serde_json::to_vec(b).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_session_stays_past_the_cap_until_its_queue_outweighs_it() {
    let ups = upstreams(3, Mode::Raw(200, "application/json", ANSWER)).await;
    let gw = Gateway::start(&yaml("agents", &ids(&ups), &[], "")).await;
    let system = text(1, 1500);
    // Six turns of one session: a task, then answers and tool results of
    // ~100 tokens each, every one sent once the last has been answered.
    let mut turns: Vec<(String, String)> = Vec::new();
    let mut last = text(2, 100);
    let mut home = String::new();
    for t in 0..6u64 {
        let b = body(&system, "session-1", &turns, &last);
        let v = explain(&gw, &b).await;
        let r = post(&gw, &b).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let by = served_by(&r);
        if t == 0 {
            home = by;
        } else {
            assert_eq!(v["reason"], "cache_hit", "turn {t}: {v}");
            assert_eq!(by, home, "turn {t} moved: {v}");
        }
        turns.push((last, text(10 + t, 50)));
        last = text(20 + t, 60);
    }
    let h = ups.iter().position(|u| u.state.name == home).unwrap();
    // Its instance stops answering; three more turns wait there. With 3 in
    // flight on 3 instances the cap is ⌈1.5 · 4 / 3⌉ = 2, and its limit 3.
    *ups[h].state.mode.lock().unwrap() = Mode::Hold;
    let mut held = Vec::new();
    let mut send_held = |b: &Value| held.push(tokio::spawn(post(&gw, b).send()));
    for k in 0..3u64 {
        send_held(&body(&system, "session-1", &turns, &text(30 + k, 20)));
        eventually("a turn held at home", || {
            ups[h]
                .state
                .active
                .load(std::sync::atomic::Ordering::SeqCst)
                == k as usize + 1
        })
        .await;
    }
    // The session's next turn still goes home, over the cap: recomputing its
    // ~2,300 tokens elsewhere costs more than the three turns decoding there.
    let next = body(&system, "session-1", &turns, &text(40, 20));
    let v = explain(&gw, &next).await;
    assert_eq!(at(&v, &home)["in_flight"], 3, "{v}");
    assert_eq!(
        (v["chosen"].as_str(), v["reason"].as_str()),
        (Some(home.as_str()), Some("cache_hit")),
        "{v}"
    );
    let opening = v["opening_tokens_estimate"].as_u64().unwrap();
    assert!(
        (1400..1700).contains(&opening),
        "the system prompt's ~1,500 tokens: {v}"
    );
    // A new session over the same system prompt starts on its own ring
    // instance under the caps (not the full one), which then holds the
    // system prompt too.
    let fresh = body(&system, "session-2", &[], &text(50, 100));
    let v = explain(&gw, &fresh).await;
    assert_eq!(v["opening_tokens_estimate"], Value::Null, "{v}");
    assert_ne!(v["chosen"].as_str(), Some(home.as_str()), "{v}");
    // (`affinity` when it is not also the cheapest of the rest.)
    assert!(
        ["affinity", "cache_spread"].contains(&v["reason"].as_str().unwrap()),
        "{v}"
    );
    let spread_to = v["chosen"].as_str().unwrap().to_owned();
    let r = post(&gw, &fresh).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), served_by(&r)),
        (200, spread_to.clone())
    );
    // More of the session's turns wait at home, each adding what its decoding
    // costs the others there, until recomputing the session's own ~800
    // tokens where the system prompt is now held too costs less.
    let mut stayed = 3;
    let left = loop {
        let b = body(&system, "session-1", &turns, &text(100 + stayed, 20));
        let v = explain(&gw, &b).await;
        if v["chosen"] != home.as_str() {
            break v;
        }
        assert_eq!(v["reason"], "cache_hit", "{v}");
        stayed += 1;
        send_held(&b);
        eventually("a turn held at home", || {
            ups[h]
                .state
                .active
                .load(std::sync::atomic::Ordering::SeqCst)
                == stayed as usize
        })
        .await;
        assert!(stayed < 64, "never left a queue of {stayed}: {v}");
    };
    assert_eq!(left["reason"], "cache_spread", "{left}");
    let chosen = left["chosen"].as_str().unwrap();
    let (home_cost, there) = (
        at(&left, &home)["cost"].as_u64().unwrap(),
        at(&left, chosen),
    );
    assert!(
        at(&left, &home)["queued_tokens"].as_u64().unwrap()
            > there["uncached_tokens"].as_u64().unwrap()
                - at(&left, &home)["uncached_tokens"].as_u64().unwrap(),
        "left for a queue shorter than the recompute: {left}"
    );
    assert!(there["cost"].as_u64().unwrap() < home_cost, "{left}");
    assert!(stayed > 4, "left after {stayed} turns queued: {left}");
    assert_eq!(chosen, spread_to, "{left}");
    for t in held {
        t.abort();
    }
}

/// A chat body: `system` (if any), each (question, answer), then `last`.
fn chat_body(system: Option<&str>, turns: &[(String, String)], last: &str) -> Value {
    let mut messages: Vec<Value> = system
        .map(|s| json!({"role": "system", "content": s}))
        .into_iter()
        .collect();
    for (q, a) in turns {
        messages.push(json!({"role": "user", "content": q}));
        messages.push(json!({"role": "assistant", "content": a}));
    }
    messages.push(json!({"role": "user", "content": last}));
    json!({"model": MODEL, "messages": messages})
}

/// Send `b` over chat (decided as `explain` says first); who served it and
/// the decision.
async fn chat_turn(gw: &Gateway, b: &Value) -> (String, Value) {
    let v = explain_chat(gw, None, b).await;
    let r = request(gw, "/v1/chat/completions", None, b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    (served_by(&r), v)
}

/// Keep `up` busy with a first question over `system`, held unanswered.
async fn hold(
    gw: &Gateway,
    up: &Upstream,
    system: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    up.set_mode(Mode::Hold);
    let body = chat_body(Some(system), &[], &text(99, 60));
    let busy = tokio::spawn(request(gw, "/v1/chat/completions", None, &body).send());
    eventually("a request held by the holder", || {
        up.state.active.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    busy
}

/// Let `up` answer again, its held request gone.
async fn release(up: &Upstream, busy: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) {
    busy.abort();
    up.set_mode(Mode::Json);
    eventually("the held request gone", || {
        up.state.active.load(std::sync::atomic::Ordering::SeqCst) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_conversations_over_one_opening_spread_from_their_second_turn() {
    let ups = upstreams(4, Mode::Json).await;
    let gw = Gateway::start(&yaml("chat", &ids(&ups), &[], "")).await;
    let system = text(1, 1500);
    // Eight conversations' first questions, one after another: each goes
    // where the system prompt is held, since nothing tells them apart yet.
    let mut firsts = Vec::new();
    for c in 0..8u64 {
        let q = text(100 + c, 60);
        let (by, v) = chat_turn(&gw, &chat_body(Some(&system), &[], &q)).await;
        if c > 0 {
            assert_eq!(v["reason"], "cache_hit", "conversation {c}: {v}");
        }
        firsts.push((q, by));
    }
    let holder = firsts[0].1.clone();
    assert!(firsts.iter().all(|(_, by)| *by == holder), "{firsts:?}");
    let h = ups.iter().position(|u| u.state.name == holder).unwrap();
    let second = |c: usize| {
        let turns = vec![(firsts[c].0.clone(), text(200 + c as u64, 20))];
        let b = chat_body(Some(&system), &turns, &text(300 + c as u64, 40));
        (turns, b)
    };
    // Busy with another request, the holder keeps only the conversations
    // its instance is named for: each other would go to the instance its
    // opening and first question name, and the fleet shares them.
    let busy = hold(&gw, &ups[h], &system).await;
    let mut moved = Vec::new();
    for c in 0..firsts.len() {
        let v = explain_chat(&gw, None, &second(c).1).await;
        assert!(v["opening_tokens_estimate"].as_u64().is_some(), "{v}");
        let chosen = v["chosen"].as_str().unwrap().to_owned();
        if chosen != holder {
            assert_eq!(v["reason"], "affinity", "conversation {c}: {v}");
            moved.push((c, chosen));
        }
    }
    let used: std::collections::BTreeSet<&String> = moved.iter().map(|(_, by)| by).collect();
    assert!(
        used.len() >= 2 && moved.len() >= 4,
        "second turns to {moved:?}"
    );
    // With the holder idle again, a second turn stays with its first: a move
    // would recompute it for nothing.
    release(&ups[h], busy).await;
    let v = explain_chat(&gw, None, &second(moved[0].0).1).await;
    assert_eq!(
        (v["chosen"].as_str(), v["reason"].as_str()),
        (Some(holder.as_str()), Some("cache_hit")),
        "{v}"
    );
    let busy = hold(&gw, &ups[h], &system).await;
    let mut homes = Vec::new();
    for (c, chosen) in moved {
        let (turns, b) = second(c);
        let (by, v) = chat_turn(&gw, &b).await;
        assert_eq!(by, chosen, "{v}");
        homes.push((c, turns, by));
    }
    release(&ups[h], busy).await;
    // Each stays where its second turn went from then on.
    for (c, mut turns, home) in homes {
        turns.push((text(300 + c as u64, 40), text(400 + c as u64, 20)));
        let b = chat_body(Some(&system), &turns, &text(500 + c as u64, 40));
        let (by, v) = chat_turn(&gw, &b).await;
        assert_eq!(
            (by, v["reason"].as_str()),
            (home, Some("cache_hit")),
            "conversation {c}: {v}"
        );
    }
    // A conversation named by the client (`prompt_cache_key`), or one whose
    // own history already outweighs its opening (none, or a short one), is
    // never moved to a home, even while its instance is busy (with its own
    // first question again).
    let mut keyed = chat_body(Some(&system), &[], &text(600, 60));
    keyed["prompt_cache_key"] = json!("conversation-9");
    let mut next = chat_body(
        Some(&system),
        &[(text(600, 60), text(601, 20))],
        &text(602, 40),
    );
    next["prompt_cache_key"] = json!("conversation-9");
    let untold = chat_body(None, &[], &text(700, 200));
    let long = chat_body(None, &[(text(700, 200), text(701, 20))], &text(702, 40));
    let short = text(900, 30);
    let brief = chat_body(Some(&short), &[], &text(901, 200));
    let past = chat_body(
        Some(&short),
        &[(text(901, 200), text(902, 20))],
        &text(903, 40),
    );
    // Nor is a body that ends with an answer the client prefills.
    let asked = chat_body(Some(&system), &[], &text(800, 60));
    let mut prefilled = asked.clone();
    prefilled["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "{"}));
    for (first, next) in [
        (keyed, next),
        (untold, long),
        (brief, past),
        (asked, prefilled),
    ] {
        let (by, _) = chat_turn(&gw, &first).await;
        let u = ups.iter().position(|u| u.state.name == by).unwrap();
        ups[u].set_mode(Mode::Hold);
        // Its first question again, with an answer prefilled: placed by cost
        // alone, so where it is held (a first question holding less than an
        // engine step goes where the fewest sessions started).
        let mut again = first.clone();
        again["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "assistant", "content": "{"}));
        let busy = tokio::spawn(request(&gw, "/v1/chat/completions", None, &again).send());
        eventually("its first question held again", || {
            ups[u]
                .state
                .active
                .load(std::sync::atomic::Ordering::SeqCst)
                == 1
        })
        .await;
        let v = explain_chat(&gw, None, &next).await;
        assert_eq!(
            (v["chosen"].as_str(), v["reason"].as_str()),
            (Some(by.as_str()), Some("cache_hit")),
            "{v}"
        );
        busy.abort();
        ups[u].set_mode(Mode::Json);
        eventually("the held request gone", || {
            ups[u]
                .state
                .active
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0
        })
        .await;
    }
}

/// Explain `b`, then send it: the instance that served it, and the explain.
async fn served(gw: &Gateway, b: &Value) -> (String, Value) {
    let v = explain(gw, b).await;
    let r = post(gw, b).send().await.unwrap();
    assert_eq!(r.status(), 200);
    (served_by(&r), v)
}

/// Session `s`'s first question.
fn first(s: usize) -> String {
    text(200 + s as u64, 300)
}

/// Session `s`'s next question: after its first, or its first. Session 0's
/// second is a long tool result, which gives its instance the most work of
/// the fleet while it has one session like the others.
fn next(past: Option<&(String, String)>, s: usize) -> String {
    match past {
        Some(_) if s == 0 => text(300, 3000),
        Some(_) => text(300 + s as u64, 80),
        None => first(s),
    }
}

/// Eight sessions, one after another, each sending its first turn and then a
/// second with its history: the first turns spread by count (two an
/// instance of four), whatever the ring or the work given lately would say
/// (the work would keep new sessions off session 0's instance), and every
/// second turn stays where its first went.
async fn eight_sessions_start_two_an_instance(
    ups: &[Upstream],
    turn: impl AsyncFn(Option<&(String, String)>, usize) -> (String, Value),
) {
    // The counts halve on boundaries shared by the whole process; one may
    // fall inside this test, and then every count before it halves.
    let period = || kvgate::fleet::instance::now_ms() / SESSION_HALF_LIFE_MS;
    let since = period();
    let sessions = |v: &Value, id: &str| at(v, id)["recent_sessions"].as_f64().unwrap();
    let mut started = std::collections::HashMap::<String, usize>::new();
    for s in 0..8usize {
        let (by, v) = turn(None, s).await;
        let counts: Vec<f64> = ups.iter().map(|u| sessions(&v, &u.state.name)).collect();
        let sum: f64 = counts.iter().sum();
        if period() == since {
            assert_eq!(sum, s as f64, "every start counted where it went: {v}");
        } else {
            assert!(sum >= s as f64 / 2.0 && sum <= s as f64, "{v}");
        }
        let fewest = counts.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(sessions(&v, &by), fewest, "session {s}: {v}");
        *started.entry(by.clone()).or_default() += 1;
        let (again, v) = turn(Some(&(first(s), "ok".to_owned())), s).await;
        assert_eq!(again, by, "session {s}'s second turn moved: {v}");
        assert_eq!(v["reason"], "cache_hit", "{v}");
    }
    let mut counts: Vec<usize> = started.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, [2, 2, 2, 2], "{started:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_start_evenly_by_count_over_messages_and_keyed_chat() {
    let system = text(1, 1500);
    // Messages, `metadata.user_id` naming each session.
    let ups = upstreams(4, Mode::Raw(200, "application/json", ANSWER)).await;
    let gw = Gateway::start(&yaml("agents", &ids(&ups), &[], "")).await;
    eight_sessions_start_two_an_instance(&ups, async |past, s| {
        let turns: Vec<(String, String)> = past.into_iter().cloned().collect();
        served(
            &gw,
            &body(&system, &format!("session-{s}"), &turns, &next(past, s)),
        )
        .await
    })
    .await;
    // Chat, each conversation under its own `prompt_cache_key`.
    let ups = upstreams(4, Mode::Json).await;
    let gw = Gateway::start(&yaml("agents", &ids(&ups), &[], "")).await;
    eight_sessions_start_two_an_instance(&ups, async |past, s| {
        let turns: Vec<(String, String)> = past.into_iter().cloned().collect();
        let mut b = chat_body(Some(&system), &turns, &next(past, s));
        b["prompt_cache_key"] = json!(format!("conversation-{s}"));
        chat_turn(&gw, &b).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_chat_conversations_over_a_short_opening_start_evenly() {
    // A system prompt of one block (64 tokens): an instance holding it saves
    // less than an engine step's fixed cost, so it does not draw every new
    // conversation; nothing names them, and they spread by count as named
    // sessions do.
    let system = text(1, 64);
    let ups = upstreams(4, Mode::Json).await;
    let gw = Gateway::start(&yaml("chat", &ids(&ups), &[], "")).await;
    eight_sessions_start_two_an_instance(&ups, async |past, s| {
        let turns: Vec<(String, String)> = past.into_iter().cloned().collect();
        let (by, v) = chat_turn(&gw, &chat_body(Some(&system), &turns, &next(past, s))).await;
        if past.is_none() && s > 0 {
            let notes = v["notes"].to_string();
            assert!(notes.contains("first question that nothing names"), "{v}");
        }
        (by, v)
    })
    .await;
}

/// A session's start is counted where it is served: an instance that fails
/// its first turn (503, the request fails over) is not charged a session,
/// so the next session still sees it as the emptiest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_failed_over_is_counted_only_where_it_was_served() {
    let system = text(1, 1500);
    let ups = upstreams(2, Mode::Raw(200, "application/json", ANSWER)).await;
    ups[0].set_mode(Mode::Raw(503, "application/json", r#"{"error":"busy"}"#));
    let gw = Gateway::start(&yaml("agents", &ids(&ups), &[], "")).await;
    let (bad, good) = (&ups[0].state.name, &ups[1].state.name);
    let period = || kvgate::fleet::instance::now_ms() / SESSION_HALF_LIFE_MS;
    let since = period();
    for s in 0..3 {
        let b = body(&system, &format!("session-{s}"), &[], &first(s));
        let r = post(&gw, &b).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(&served_by(&r), good);
    }
    let v = explain(&gw, &body(&system, "session-3", &[], &first(3))).await;
    let sessions = |id: &str| at(&v, id)["recent_sessions"].as_f64().unwrap();
    assert_eq!(sessions(bad), 0.0, "{v}");
    if period() == since {
        assert_eq!(sessions(good), 3.0, "{v}");
    }
    // The failing instance was tried: it is the emptiest by count.
    assert!(!ups[0].seen().is_empty());
}

/// A hinted session's later first turn (a new task, a sub-agent: no history,
/// the same `metadata.user_id`) returns to the instance the session lives on,
/// though others had fewer sessions start, and is not counted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_later_first_turn_returns_where_it_lives() {
    let system = text(1, 1500);
    let ups = upstreams(4, Mode::Raw(200, "application/json", ANSWER)).await;
    let gw = Gateway::start(&yaml("agents", &ids(&ups), &[], "")).await;
    let period = || kvgate::fleet::instance::now_ms() / SESSION_HALF_LIFE_MS;
    let since = period();
    let send = async |session: &str, question: &str| {
        served(&gw, &body(&system, session, &[], question)).await
    };
    let (home, v) = send("session-a", &first(0)).await;
    assert!(
        ups.iter()
            .all(|u| at(&v, &u.state.name)["hosts_session"] == false),
        "{v}"
    );
    let (other, _) = send("session-b", &first(1)).await;
    assert_ne!(other, home, "a new session starts where none did");
    let (again, v) = send("session-a", &first(2)).await;
    assert_eq!(again, home, "{v}");
    assert_eq!(at(&v, &home)["hosts_session"], true, "{v}");
    let v = explain(&gw, &body(&system, "session-c", &[], &first(3))).await;
    let sessions: f64 = ups
        .iter()
        .map(|u| at(&v, &u.state.name)["recent_sessions"].as_f64().unwrap())
        .sum();
    if period() == since {
        assert_eq!(sessions, 2.0, "session-a counted once: {v}");
    }
}

/// Within one half-life: one session counted where it started and one where
/// it went, none elsewhere.
fn counted_where_it_started_and_went(ups: &[Upstream], v: &Value, (home, moved): (&str, &str)) {
    for u in ups {
        let n = at(v, &u.state.name)["recent_sessions"].as_f64().unwrap();
        let want = if u.state.name == home || u.state.name == moved {
            1.0
        } else {
            0.0
        };
        assert_eq!(n, want, "counted where it started and where it went: {v}");
    }
}

/// A hinted session whose turn is taken off the instance that served it (here
/// by a failover) now lives where it was served: it is counted there, so the
/// next new session starts elsewhere, and its next first turn returns there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_moves_is_counted_where_it_went() {
    let system = text(1, 1500);
    let ups = upstreams(3, Mode::Raw(200, "application/json", ANSWER)).await;
    let gw = Gateway::start(&yaml("agents", &ids(&ups), &[], "")).await;
    let period = || kvgate::fleet::instance::now_ms() / SESSION_HALF_LIFE_MS;
    let since = period();
    let send = async |b: &Value| served(&gw, b).await;
    let (home, _) = send(&body(&system, "session-a", &[], &first(0))).await;
    let h = ups.iter().position(|u| u.state.name == home).unwrap();
    ups[h].set_mode(Mode::Raw(503, "application/json", r#"{"error":"busy"}"#));
    let turns = [(first(0), "ok".to_owned())];
    let (moved, _) = send(&body(&system, "session-a", &turns, &next(turns.first(), 1))).await;
    assert_ne!(moved, home);
    ups[h].set_mode(Mode::Raw(200, "application/json", ANSWER));
    let (again, v) = send(&body(&system, "session-a", &[], &first(2))).await;
    assert_eq!(again, moved, "its next first turn follows it: {v}");
    assert_eq!(at(&v, &moved)["hosts_session"], true, "{v}");
    if period() == since {
        counted_where_it_started_and_went(&ups, &v, (&home, &moved));
    }
    // A new session starts on the instance no session lives on.
    let (other, v) = send(&body(&system, "session-b", &[], &first(3))).await;
    assert!(other != home && other != moved, "{v}");
}

/// An unnamed chat conversation whose later turn is taken off the instance
/// holding its history (here by a failover) lives where it was served: it is
/// counted as a session started there, so the next new conversation starts
/// on the instance no conversation lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_conversation_that_moves_is_counted_where_it_went() {
    let system = text(1, 64);
    let ups = upstreams(3, Mode::Json).await;
    let gw = Gateway::start(&yaml("chat", &ids(&ups), &[], "")).await;
    let period = || kvgate::fleet::instance::now_ms() / SESSION_HALF_LIFE_MS;
    let since = period();
    let (home, _) = chat_turn(&gw, &chat_body(Some(&system), &[], &first(0))).await;
    let h = ups.iter().position(|u| u.state.name == home).unwrap();
    ups[h].set_mode(Mode::Raw(503, "application/json", r#"{"error":"busy"}"#));
    let turns = [(first(0), "ok".to_owned())];
    let later = chat_body(Some(&system), &turns, &next(turns.first(), 1));
    let r = request(&gw, "/v1/chat/completions", None, &later)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let moved = served_by(&r);
    assert_ne!(moved, home);
    ups[h].set_mode(Mode::Json);
    let (other, v) = chat_turn(&gw, &chat_body(Some(&system), &[], &first(2))).await;
    assert!(other != home && other != moved, "{v}");
    // Counted where it went (a count that only halves with time).
    let sessions = |id: &str| at(&v, id)["recent_sessions"].as_f64().unwrap();
    assert!(sessions(&moved) > sessions(&other), "{v}");
    if period() == since {
        counted_where_it_started_and_went(&ups, &v, (&home, &moved));
    }
}
