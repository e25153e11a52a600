//! `kv_aware` across engine restarts and long or lossy replays, against the
//! stand-in publishers (`kv_frames`): an engine back at its old address is
//! known again within 3 s without publishing, numbering going back resets at
//! once, a replay cut short by the send limit is continued, a gap's replay
//! stops at the gap's end, and gaps that keep coming are shed and recovered
//! once.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::cache_aware::{at, explain, metric};
use super::kv_aware::{
    chat, explained, kv_yaml, not_the_cold_choice, subscribed, tokens, upstreams,
};
use super::kv_frames::{Answer, Encoding, Publisher};
use crate::common::*;

fn state(e: &Value, id: &str) -> String {
    at(e, id)["kv_events"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn count(e: &Value, id: &str, what: &str) -> u64 {
    at(e, id)["kv_events"][what].as_u64().unwrap_or(0)
}

/// Whether `id`'s events credit it with `blocks` blocks of `body`.
async fn holds(gw: &Gateway, body: &Value, id: &str, blocks: usize) -> bool {
    let e = explain(gw, None, body).await;
    at(&e, id)["source"] == "events" && at(&e, id)["held_prefix_blocks"] == blocks as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_back_at_its_address_is_known_within_3s_without_publishing() {
    let ups = upstreams(2).await;
    let mut pubs = super::kv_aware::publishers(2, Encoding::Map).await;
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let (doc, later) = (chat("restart document"), chat("after the restart"));
    let (ids, later_ids) = (tokens(&doc), tokens(&later));
    let holder = not_the_cold_choice(&gw, None, &doc, 2).await;
    let id = format!("u{holder}");
    let stored = pubs[holder].stored(500, None, &ids, 16, None);
    pubs[holder].send(vec![stored]).await;
    explained(&gw, None, &doc, |e| e["chosen"] == id.as_str()).await;

    // The engine goes down; 0.5 s later one is back at the same addresses,
    // numbering from 0, without the document and with another prompt it
    // stored before anyone subscribed (only its replay buffer has it). It
    // publishes nothing more.
    let (events, replay) = (
        pubs[holder].events_url.clone(),
        pubs[holder].replay_url.clone(),
    );
    drop(pubs.remove(holder));
    explained(&gw, None, &doc, |e| state(e, &id) == "disconnected").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut back = Publisher::start_at(Encoding::Map, &events, &replay).await;
    let stored = back.stored(9000, None, &later_ids, 16, None);
    back.batch(vec![stored], false).await;
    let back_at = Instant::now();
    loop {
        let e = explain(&gw, None, &doc).await;
        // Never credited with the document by events after the restart.
        if at(&e, &id)["source"] == "events" {
            assert_eq!(at(&e, &id)["held_prefix_blocks"], 0, "{e}");
            if holds(&gw, &later, &id, later_ids.len() / 16).await {
                assert_eq!(e["reason"], "cold", "{e}");
                assert!(count(&e, &id, "resets") >= 1, "{e}");
                break;
            }
        }
        assert!(
            back_at.elapsed() < Duration::from_secs(3),
            "not caught up 3 s after the engine came back: {e}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbering_going_back_resets_and_replays_the_new_history_at_once() {
    for enc in [Encoding::Array, Encoding::Map] {
        let ups = upstreams(2).await;
        let mut pubs = super::kv_aware::publishers(2, enc).await;
        let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
        subscribed(&[&gw], &mut pubs).await;
        let (doc, later) = (chat("numbering document"), chat("numbering later"));
        let (ids, later_ids) = (tokens(&doc), tokens(&later));
        let holder = not_the_cold_choice(&gw, None, &doc, 2).await;
        let id = format!("u{holder}");
        let stored = pubs[holder].stored(500, None, &ids, 16, None);
        pubs[holder].send(vec![stored]).await;
        explained(&gw, None, &doc, |e| e["chosen"] == id.as_str()).await;

        // Restarted without the socket dropping: batch 0 (not heard) stored
        // another prompt, batch 1 is the first the gateway hears.
        pubs[holder].restart();
        let stored = pubs[holder].stored(7000, None, &later_ids, 16, None);
        pubs[holder].batch(vec![stored], false).await;
        pubs[holder].send(vec![]).await;
        let sent = Instant::now();
        while !holds(&gw, &later, &id, later_ids.len() / 16).await {
            assert!(sent.elapsed() < Duration::from_secs(3), "{enc:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let e = explain(&gw, None, &doc).await;
        assert_eq!(e["reason"], "cold", "{enc:?}: {e}");
        assert_eq!(at(&e, &id)["held_prefix_blocks"], 0);
    }
}

/// One block each, distinct: batch `i` stores a root block of tokens `i…`.
fn one_block(p: &Publisher, i: u64) -> rmpv::Value {
    let t = u32::try_from(i).unwrap() * 16;
    let ids: Vec<u32> = (t + 100_000..t + 100_016).collect();
    p.stored(1_000_000 + i, None, &ids, 16, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_cut_short_by_the_send_limit_is_continued_and_routed_as_unknown_until_whole() {
    // vLLM's ROUTER drops what exceeds its high-water mark of 1,000: the
    // rest of the answer and its end marker, a stretch in the middle, or
    // the tail of a later answer while its end marker gets through.
    for lost in [(1000, usize::MAX), (1000, 400), (1000, 500)] {
        let ups = upstreams(2).await;
        let mut pubs = super::kv_aware::publishers(2, Encoding::Map).await;
        // Every answer comes slowly (a batch a millisecond), so the state
        // while the replay runs lasts seconds however fast the machine is:
        // the gateway leaves an answer at its gap and asks again, so pacing
        // only an answer's tail would not slow the replay down.
        *pubs[1].answer.lock().unwrap() = Answer {
            lost: Some(lost),
            pace_after: 0,
            pace: Duration::from_millis(1),
        };
        let doc = chat("long history");
        let ids = tokens(&doc);
        for i in 0..2499 {
            let b = one_block(&pubs[1], i);
            pubs[1].batch(vec![b], false).await;
        }
        let stored = pubs[1].stored(5, None, &ids, 16, None);
        pubs[1].batch(vec![stored], false).await;
        let whole = 2499 + ids.len() / 16;

        let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
        let mut seen_replaying = false;
        let e = loop {
            let e = explain(&gw, None, &doc).await;
            match state(&e, "u1").as_str() {
                "replaying" => seen_replaying = true,
                "events" => break e,
                "disconnected" => {}
                other => panic!("{lost:?}: {other}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(seen_replaying, "{lost:?}: never routed as replaying");
        assert_eq!(
            at(&e, "u1")["kv_events"]["held_blocks"],
            whole as u64,
            "{lost:?}: {e}"
        );
        assert_eq!(e["chosen"], "u1", "{lost:?}: {e}");
        assert_eq!(at(&e, "u1")["source"], "events");
        subscribed(&[&gw], &mut pubs).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gaps_replay_stops_at_the_gaps_end() {
    let ups = upstreams(2).await;
    let mut pubs = super::kv_aware::publishers(2, Encoding::Map).await;
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let doc = chat("gap end");
    let ids = tokens(&doc);
    let holder = not_the_cold_choice(&gw, None, &doc, 2).await;
    let id = format!("u{holder}");
    // The replay socket answers slowly after its first few batches: reading
    // past the gap's end would take 5 s.
    *pubs[holder].answer.lock().unwrap() = Answer {
        lost: None,
        pace_after: 3,
        pace: Duration::from_millis(5),
    };
    let replays = count(&explain(&gw, None, &doc).await, &id, "replays");
    let p = &mut pubs[holder];
    let stored = p.stored(40, None, &ids, 16, None);
    p.batch(vec![stored], false).await;
    let reveals = p.batch(vec![], false).await;
    for _ in 0..1000 {
        p.batch(vec![], false).await;
    }
    p.publish_buffered(reveals).await;
    let sent = Instant::now();
    let e = explained(&gw, None, &doc, |e| {
        e["chosen"] == id.as_str()
            && at(e, &id)["source"] == "events"
            && count(e, &id, "replays") > replays
    })
    .await;
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(count(&e, &id, "gaps"), 1, "{e}");
    assert_eq!(count(&e, &id, "resets"), 0, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_that_keep_coming_are_shed_and_recovered_once() {
    let ups = upstreams(2).await;
    let mut pubs = super::kv_aware::publishers(2, Encoding::Array).await;
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let docs: Vec<Value> = (0..3).map(|i| chat(&format!("shed {i}"))).collect();
    let holder = not_the_cold_choice(&gw, None, &docs[0], 2).await;
    let id = format!("u{holder}");
    let ids: Vec<Vec<u32>> = docs.iter().map(tokens).collect();
    let p = &mut pubs[holder];
    // Two gaps back to back (the publisher dropping what the gateway did not
    // read in time), then batches that arrive while it sheds.
    for (i, ids) in ids.iter().enumerate() {
        let stored = p.stored(100 * (i as u64 + 1), None, ids, 16, None);
        let live = i == 2;
        p.batch(vec![stored], live).await;
        p.send(vec![]).await;
    }
    for _ in 0..20 {
        p.send(vec![]).await;
    }
    for doc in &docs {
        explained(&gw, None, doc, |e| {
            e["chosen"] == id.as_str() && at(e, &id)["source"] == "events"
        })
        .await;
    }
    let e = explain(&gw, None, &docs[0]).await;
    assert!(count(&e, &id, "shed") >= 1, "{e}");
    assert!(count(&e, &id, "gaps") >= 2, "{e}");
    assert_eq!(count(&e, &id, "resets"), 0, "{e}");
    let shed = metric(
        &gw,
        "kvgate_kv_shed_batches_total",
        &[&format!("upstream=\"{id}\"")],
    )
    .await;
    assert!(shed >= 1.0, "{shed}");
    // Still followed afterwards, batch by batch.
    let later = chat("shed later");
    let stored = pubs[holder].stored(900, None, &tokens(&later), 16, None);
    pubs[holder].send(vec![stored]).await;
    explained(&gw, None, &later, |e| e["chosen"] == id.as_str()).await;
}
