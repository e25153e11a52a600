//! An instance's queue ahead of a first token, in-flight guard, failure back-off, ejection, health probes and cooldown.
use super::*;

#[test]
fn what_a_first_token_waits_for_is_the_queue_without_its_overheads() {
    let i = Instance::new("e", "i", "http://127.0.0.1:1");
    let overhead = kvgate_routing::cost::REQUEST_OVERHEAD;
    let mut a = i.claim(1000 + overhead);
    let b = i.claim(overhead);
    assert_eq!(
        i.queued_ahead(300),
        Ahead {
            work: 1300,
            requests: 2
        }
    );
    a.first_byte();
    assert_eq!(
        i.queued_ahead(0),
        Ahead {
            work: 0,
            requests: 1
        }
    );
    drop(b);
    assert_eq!(i.queued_ahead(0), Ahead::default());
    assert_eq!(i.queued_prefill(), 0);
}

#[test]
fn guard_counts_and_releases() {
    let i = Instance::new("e", "a", "http://a");
    let mut g1 = i.claim(100);
    let g2 = i.claim(50);
    assert_eq!((i.in_flight(), i.queued_prefill()), (2, 150));
    g1.prefill_done();
    g1.prefill_done();
    assert_eq!((i.in_flight(), i.queued_prefill()), (2, 50));
    drop(g1);
    assert_eq!(i.in_flight(), 1);
    drop(g2);
    assert_eq!((i.in_flight(), i.queued_prefill()), (0, 0));
}

#[tokio::test]
async fn a_non_streaming_charge_is_given_back_once_the_queue_has_drained() {
    let i = Instance::new("e", "a", "http://a");
    // A streamed answer shows 4,096 uncached tokens prefilled in ≥ 100 ms.
    let mut g = i.claim(4096 + kvgate_routing::cost::REQUEST_OVERHEAD);
    tokio::time::sleep(Duration::from_millis(100)).await;
    g.first_byte();
    drop(g);
    // A non-streaming one behind 4,096 queued tokens: ≥ 190 ms of prefill in all.
    let ahead = i.claim(3840);
    let g = i.claim(3840);
    g.release_at_drain(4096);
    // The charges held (what routing sees is less: the queue drains at the
    // rate shown meanwhile, a separate matter).
    let held = || i.queued_prefill.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(held(), 7680, "given back before it could have drained");
    assert!(i.queued_prefill() < 7680, "draining at the rate shown");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(held(), 3840, "its charge given back, not the one ahead");
    assert_eq!(i.in_flight(), 2, "the slot is held until the answer ends");
    drop((ahead, g));
    assert_eq!(i.queued_prefill(), 0);
}

#[test]
fn backoff_doubles_and_caps() {
    let b = Duration::from_secs(1);
    assert_eq!(backoff(b, 1), b);
    assert_eq!(backoff(b, 3), Duration::from_secs(4));
    assert_eq!(backoff(b, 30), MAX_COOLDOWN);
}

#[test]
fn three_5xx_in_a_row_eject_and_success_resets() {
    let i = Instance::new("e", "a", "http://a");
    i.server_error(Duration::from_secs(60));
    i.server_error(Duration::from_secs(60));
    i.succeeded();
    i.server_error(Duration::from_secs(60));
    assert!(i.available(), "streak was reset by the success");
    i.server_error(Duration::from_secs(60));
    i.server_error(Duration::from_secs(60));
    assert!(!i.available());
}

#[test]
fn probes_flip_health_after_thresholds() {
    let i = Instance::new("e", "a", "http://a");
    i.probe(false, 2, 3);
    i.probe(false, 2, 3);
    assert!(i.is_healthy());
    i.probe(false, 2, 3);
    assert!(!i.is_healthy());
    i.probe(true, 2, 3);
    assert!(!i.is_healthy());
    i.probe(true, 2, 3);
    assert!(i.is_healthy());
}

#[test]
fn cool_down_makes_unavailable() {
    let i = Instance::new("e", "a", "http://a");
    assert!(i.available());
    i.cool_down(Duration::from_secs(60));
    assert!(!i.available());
    assert!(i.is_healthy());
}
