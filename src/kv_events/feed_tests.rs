//! Feeds of one endpoint share its fleet-wide index: a block both report is
//! stored once, a reset drops one feed's holdings, a dropped feed frees its slot.
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use kvgate_routing::held::Medium;

const W: TierWeights = TierWeights { cpu: 0.5, l2: 0.25 };

fn feed(fleet: &Arc<FleetHeld>, id: &str) -> Feed {
    let settings = FeedSettings {
        silence: Duration::from_secs(60),
        limit: 1 << 16,
        block_size: 16,
    };
    Feed::new(("ep", id), "tcp://127.0.0.1:1", None, settings, fleet)
}

fn stored(tokens: &[u32], first_hash: u64) -> Batch {
    let n = tokens.len() as u64 / 16;
    Batch {
        ts: 0.0,
        events: vec![Event::Stored {
            hashes: (first_hash..first_hash + n).collect(),
            parent: None,
            token_ids: tokens.to_vec(),
            block_size: 16,
            lora: false,
            medium: Medium::Gpu,
            salt: None,
        }],
    }
}

#[test]
fn feeds_share_one_index_and_reset_or_drop_only_their_own() {
    let fleet = Arc::new(FleetHeld::new());
    let (a, b) = (feed(&fleet, "a"), feed(&fleet, "b"));
    let tokens: Vec<u32> = (0..64).collect();
    let keys = held::token_keys(held::seed(None), &tokens, 16, 100);
    // Different engine hashes for the same blocks: keyed alike.
    a.apply(&stored(&tokens, 1), Instant::now());
    b.apply(&stored(&tokens, 500), Instant::now());
    assert_eq!(fleet.len(), 4, "each block stored once");
    assert_eq!((a.held_blocks(), b.held_blocks()), (4, 4));
    let (sa, sb) = (
        a.slot().unwrap_or(0) as usize,
        b.slot().unwrap_or(0) as usize,
    );
    let all = fleet.matched_all(&keys, None, W);
    assert_eq!((all[sa].blocks, all[sb].blocks), (4, 4));
    assert_eq!(a.matched(&keys, None, W).blocks, 4);
    a.reset();
    let all = fleet.matched_all(&keys, None, W);
    assert_eq!(
        (all[sa].blocks, all[sb].blocks),
        (0, 4),
        "a reset is one instance's"
    );
    drop(b);
    assert!(fleet.is_empty(), "a dropped feed's blocks leave");
    let c = feed(&fleet, "c");
    assert_eq!(c.slot(), Some(sb as u32), "its slot is reused");
}

#[test]
fn expected_blocks_count_in_the_walk_until_they_expire() {
    let fleet = Arc::new(FleetHeld::new());
    let a = feed(&fleet, "a");
    let tokens: Vec<u32> = (0..32).collect();
    let keys: Arc<[u64]> = held::token_keys(held::seed(None), &tokens, 16, 100).into();
    let sent = Instant::now();
    a.dispatched(&keys, None, true, sent);
    let s = a.slot().unwrap_or(0) as usize;
    assert_eq!(fleet.matched_all(&keys, None, W)[s].blocks, 2);
    a.expire_due(sent + Duration::from_secs(61));
    assert_eq!(fleet.matched_all(&keys, None, W)[s].blocks, 0);
}

#[test]
fn an_ended_subscription_leaves_the_index_though_its_feed_lives_on() {
    // A reload that points an instance at other sockets drops its
    // subscription, while an endpoint the reload replaced may still hold
    // the feed for the requests it serves.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in = rt.enter();
    let fleet = Arc::new(FleetHeld::new());
    let sub = crate::kv_events::Subscription::start(feed(&fleet, "a")).unwrap();
    let kept = Arc::clone(&sub.feed);
    let tokens: Vec<u32> = (0..64).collect();
    kept.apply(&stored(&tokens, 1), Instant::now());
    kept.set_connected(true);
    assert_eq!(fleet.len(), 4);
    drop(sub);
    assert!(fleet.is_empty(), "its blocks left with the subscription");
    assert_eq!(kept.held_blocks(), 0);
    assert_eq!(kept.trust(Instant::now()), Trust::Disconnected);
}
