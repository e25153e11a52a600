//! `kv_aware` tenants and tiers: event-learned blocks count only for the
//! tenant whose salt produced them, and a shared tier counts for every
//! instance below a local hit.

use std::time::Duration;

use serde_json::Value;

use super::cache_aware::{at, explain, send};
use super::kv_aware::{chat, explained, kv_yaml, publishers, subscribed, tokens, upstreams};
use super::kv_frames::{Encoding, Publisher};
use crate::common::Gateway;

const KEY_A: &str = "key-a";
const KEY_B: &str = "key-b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_learned_blocks_count_only_for_the_tenant_that_produced_them() {
    let ups = upstreams(3).await;
    let mut pubs = publishers(3, Encoding::Array).await;
    let top = "auth:\n  mode: api_key\n  api_keys:\n    - { tenant: a, sha256: \"f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4\" }\n    - { tenant: b, sha256: \"a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634\" }\nisolation:\n  upstream_cache_salt: true\n  salt_secret: \"test-only-salt-secret-0123456789\"\n";
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], top)).await;
    subscribed(&[&gw], &mut pubs).await;
    let body = chat("law");
    let ids = tokens(&body);
    let blocks = ids.len() as u64 / 16;
    // Tenant a's request reaches an instance; an older vLLM reports the
    // blocks without their salt: the gateway attributes them to a.
    let (status, by, _) = send(&gw, Some(KEY_A), &body).await;
    assert_eq!(status, 200);
    let x: usize = by[1..].parse().unwrap();
    let stored = pubs[x].stored(300, None, &ids, 16, None);
    pubs[x].send(vec![stored]).await;
    let e = explained(&gw, Some(KEY_A), &body, |e| {
        at(e, &by)["held_prefix_blocks"] == blocks
    })
    .await;
    assert_eq!(e["chosen"], by.as_str());
    let e = explain(&gw, Some(KEY_B), &body).await;
    assert_eq!(
        at(&e, &by)["held_prefix_blocks"],
        0,
        "b matched a's blocks: {e}"
    );

    // The same prompt stored elsewhere with no salt (a request that bypassed
    // the gateway) counts for neither salted tenant.
    let y = (x + 1) % 3;
    let stored = pubs[y].stored(600, None, &ids, 16, None);
    pubs[y].send(vec![stored]).await;
    pubs[y].send(vec![]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for key in [KEY_A, KEY_B] {
        let e = explain(&gw, Some(key), &body).await;
        assert_eq!(
            at(&e, &format!("u{y}"))["held_prefix_blocks"],
            0,
            "{key}: {e}"
        );
    }

    // A current vLLM reports the salt in extra_keys: it counts for its tenant only.
    let salt_a = {
        let seen = ups[x].seen();
        let v: Value = serde_json::from_slice(&seen.last().unwrap().body).unwrap();
        v["cache_salt"].as_str().unwrap().to_owned()
    };
    let z = (x + 2) % 3;
    let mut map = Publisher::start(Encoding::Map).await;
    std::mem::swap(&mut map.encoding, &mut pubs[z].encoding);
    let stored = pubs[z].stored(900, None, &ids, 16, Some(&salt_a));
    pubs[z].send(vec![stored]).await;
    let zid = format!("u{z}");
    explained(&gw, Some(KEY_A), &body, |e| {
        at(e, &zid)["held_prefix_blocks"] == blocks
    })
    .await;
    let e = explain(&gw, Some(KEY_B), &body).await;
    assert_eq!(at(&e, &zid)["held_prefix_blocks"], 0, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_in_a_shared_tier_count_for_every_instance_below_a_local_hit() {
    let ups = upstreams(3).await;
    let mut pubs = publishers(3, Encoding::Map).await;
    let mut l2 = Publisher::start(Encoding::Map).await;
    let shared = format!(
        "shared_tier: {{ kv_events: \"{}\", kv_replay: \"{}\", weight: 0.5 }}",
        l2.events_url, l2.replay_url
    );
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[&shared], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let body = chat("glaciology");
    let ids = tokens(&body);
    let blocks = ids.len() as u64 / 16;
    // The shared store holds the whole prompt: every instance can load it.
    let mut heard = false;
    for _ in 0..500 {
        l2.send(vec![]).await;
        let stored = l2.stored(40, None, &ids, 16, None);
        l2.send(vec![stored]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let e = explain(&gw, None, &body).await;
        if (0..3).all(|i| at(&e, &format!("u{i}"))["held_prefix_blocks"] == blocks) {
            heard = true;
            // Half weight: matched blocks are half the prompt's.
            assert_eq!(at(&e, "u0")["matched_blocks"], blocks / 2, "{e}");
            assert_eq!(at(&e, "u0")["held_prefix_gpu_blocks"], 0);
            break;
        }
    }
    assert!(heard, "the shared tier's blocks never counted");
    // One instance also holds it on its GPU: it is cheaper than the shared
    // tier. (Being a first question whose opening is all that is held, it
    // may still start elsewhere by session count: the difference is within
    // an engine step.)
    let e = explain(&gw, None, &body).await;
    let holder = (0..3)
        .find(|i| e["chosen"] != format!("u{i}").as_str())
        .unwrap();
    let stored = pubs[holder].stored(70, None, &ids, 16, None);
    pubs[holder].send(vec![stored]).await;
    let id = format!("u{holder}");
    let e = explained(&gw, None, &body, |e| at(e, &id)["matched_blocks"] == blocks).await;
    let cost = |i: usize| at(&e, &format!("u{i}"))["cost"].as_u64().unwrap();
    assert!((0..3).all(|i| i == holder || cost(holder) < cost(i)), "{e}");
    let order: Vec<&str> = e["preference_order"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        e["chosen"] == id.as_str() || (e["reason"] == "affinity" && order[1] == id),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitions_blocks_count_for_that_partition_as_under_longest_prefix() {
    let ups = upstreams(3).await;
    let mut pubs = publishers(3, Encoding::Array).await;
    let gw = Gateway::start(&kv_yaml(&ups, &pubs, &[], "")).await;
    subscribed(&[&gw], &mut pubs).await;
    let with_key = |k: Option<&str>| {
        let mut b = chat("astrophysics");
        if let Some(k) = k {
            b["prompt_cache_key"] = Value::from(k);
        }
        b
    };
    let ids = tokens(&with_key(None));
    let blocks = ids.len() as u64 / 16;
    let (status, by, _) = send(&gw, None, &with_key(Some("session-1"))).await;
    assert_eq!(status, 200);
    let x: usize = by[1..].parse().unwrap();
    let stored = pubs[x].stored(10, None, &ids, 16, None);
    pubs[x].send(vec![stored]).await;
    explained(&gw, None, &with_key(Some("session-1")), |e| {
        at(e, &by)["held_prefix_blocks"] == blocks
    })
    .await;
    for other in [Some("session-2"), None] {
        let e = explain(&gw, None, &with_key(other)).await;
        assert_eq!(at(&e, &by)["held_prefix_blocks"], 0, "{other:?}: {e}");
    }
}
