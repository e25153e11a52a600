//! The task that follows one publisher: a ZeroMQ SUB socket on vLLM's
//! `--kv-events-config` endpoint, sequence tracking, and replays from its
//! ROUTER socket when a batch is missed.
//!
//! Sequence rules (vLLM numbers batches from 0, +1 each):
//! - the next number: apply;
//! - a jump ahead: a gap. Ask the replay socket for the missing batches
//!   (`[b"", start (8 bytes BE)]`, answered by `[b"", seq, payload]` frames and
//!   an end marker of seq −1), applying them as they come, then the one
//!   received. If replay is not configured or its buffer no longer reaches
//!   back to the gap, the index is cleared and marked partial: one that missed
//!   removals would overstate what the instance holds;
//! - a number not above the last: the publisher restarted (its numbering
//!   began again, its cache is empty): reset, and catch up from batch 0.
//!
//! First contact — on subscribing, and again after every reconnection (the
//! engine may have restarted meanwhile) — starts from an empty index and reads
//! the replay buffer from batch 0 at once, so that a gateway started beside a
//! busy fleet knows what it holds before the engines' next step; batches that
//! arrive meanwhile and were replayed already are skipped. If the replay
//! reaches back to 0 the index is complete; otherwise it is partial (see
//! `feed`) until it has settled. The socket reconnects by itself; the monitor
//! tells the feed when it is up.
//!
//! vLLM 0.32 answers a replay with `[b"", topic, seq, payload]` and ends it
//! with `[b"", b"", seq −1, b""]`; the three-frame form without the topic is
//! read too.
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use zeromq::{Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::feed::Feed;
use super::wire::{self, END_OF_REPLAY};

/// How long one replay may take before it is given up.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between attempts to reach a publisher that is down.
const RETRY: Duration = Duration::from_millis(500);

/// Follow `feed`'s publisher until the task is aborted.
pub async fn run(feed: Arc<Feed>) {
    loop {
        let mut sub = zeromq::SubSocket::new();
        let mut monitor = sub.monitor();
        let connected =
            tokio::time::timeout(Duration::from_secs(10), sub.connect(&feed.events_url)).await;
        if !matches!(connected, Ok(Ok(()))) {
            tokio::time::sleep(RETRY).await;
            continue;
        }
        if sub.subscribe("").await.is_err() {
            tokio::time::sleep(RETRY).await;
            continue;
        }
        feed.set_connected(true);
        tracing::info!(events = %feed.events_url, "subscribed to KV events");
        let mut last = first_contact(&feed).await;
        // Batches the replay already applied may still be queued on the SUB socket.
        let mut skip_through = last;
        loop {
            tokio::select! {
                msg = sub.recv() => match msg {
                    Ok(m) => on_message(&feed, &mut last, &mut skip_through, &m).await,
                    Err(e) => {
                        tracing::warn!(events = %feed.events_url, error = %e, "KV event subscription failed; resubscribing");
                        break;
                    }
                },
                ev = monitor.next() => match ev {
                    Some(SocketEvent::Disconnected(_)) => {
                        feed.set_connected(false);
                        // Whoever answers next may be a restarted engine.
                        last = None;
                        tracing::warn!(events = %feed.events_url, "KV event publisher disconnected; approximate index until it is back");
                    }
                    Some(SocketEvent::Connected(..)) => feed.set_connected(true),
                    Some(_) => {}
                    None => break,
                },
            }
        }
        feed.set_connected(false);
        tokio::time::sleep(RETRY).await;
    }
}

fn frames(m: &ZmqMessage) -> Result<(u64, &[u8]), wire::WireError> {
    let parts: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
    match parts.as_slice() {
        [_topic, seq, payload] => Ok((wire::seq(seq)?, payload)),
        other => Err(wire::WireError::Frames(other.len())),
    }
}

/// Read the whole replay buffer into an emptied index; the last batch it
/// had, if any.
async fn first_contact(feed: &Feed) -> Option<u64> {
    feed.start_over();
    let (outcome, last) = replay(feed, 0, None).await;
    match outcome {
        Replayed::Whole(n) if n > 0 => {
            feed.sequence("replay");
            tracing::info!(events = %feed.events_url, batches = n, "KV events replayed on subscribing");
        }
        Replayed::Short => feed.partial(false, Instant::now()),
        // Nothing published yet, or no replay socket: the first batch decides.
        Replayed::Whole(_) | Replayed::Unavailable => {}
    }
    last
}

async fn on_message(
    feed: &Feed,
    last: &mut Option<u64>,
    skip_through: &mut Option<u64>,
    m: &ZmqMessage,
) {
    let (seq, payload) = match frames(m) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(events = %feed.events_url, error = %e, "malformed KV event message");
            feed.malformed();
            return;
        }
    };
    match *skip_through {
        Some(done) if seq <= done => return,
        Some(_) => *skip_through = None,
        None => {}
    }
    // (first batch to catch up from, whether the index starts from empty)
    let catch_up = match *last {
        Some(l) if seq == l.wrapping_add(1) => None,
        Some(l) if seq > l => {
            feed.sequence("gap");
            tracing::warn!(events = %feed.events_url, from = l + 1, to = seq, "KV event gap");
            Some((l + 1, false))
        }
        Some(l) => {
            tracing::info!(events = %feed.events_url, seq, last = l, "KV event publisher restarted; resetting its index");
            feed.reset();
            Some((0, true))
        }
        None => {
            // First contact: start from nothing and read the history.
            feed.start_over();
            Some((0, true))
        }
    };
    if let Some((from, fresh)) = catch_up.filter(|&(from, _)| from < seq) {
        match replay(feed, from, Some(seq)).await.0 {
            Replayed::Whole(n) => {
                feed.sequence("replay");
                tracing::info!(events = %feed.events_url, batches = n, "KV events replayed");
            }
            // What was missed may include removals: a gap's index is cleared.
            Replayed::Short | Replayed::Unavailable => feed.partial(!fresh, Instant::now()),
        }
    }
    *last = Some(seq);
    feed.counters
        .next_seq
        .store(seq.wrapping_add(1), std::sync::atomic::Ordering::Relaxed);
    apply(feed, payload);
}

fn apply(feed: &Feed, payload: &[u8]) {
    match wire::decode(payload) {
        Ok(batch) => feed.apply(&batch, Instant::now()),
        Err(e) => {
            tracing::warn!(events = %feed.events_url, error = %e, "undecodable KV event batch");
            feed.malformed();
        }
    }
}

enum Replayed {
    /// Every batch from the one asked for, applied.
    Whole(u64),
    /// The buffer no longer reached back that far; what it had was applied
    /// if the index started from empty.
    Short,
    /// No replay socket, or it did not answer in time.
    Unavailable,
}

/// Replay batches `from..to` (`None`: to the end of the buffer), applying
/// each as it arrives (in order; a replay never buffers the whole history);
/// also the last batch applied.
async fn replay(feed: &Feed, from: u64, to: Option<u64>) -> (Replayed, Option<u64>) {
    let Some(url) = feed.replay_url.as_deref() else {
        return (Replayed::Unavailable, None);
    };
    let mut applied = None;
    let applied_ref = &mut applied;
    let work = async {
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(url).await.ok()?;
        let mut req = ZmqMessage::from(Vec::<u8>::new());
        req.push_back(from.to_be_bytes().to_vec().into());
        dealer.send(req).await.ok()?;
        let mut next = from;
        let mut short = false;
        loop {
            let m = dealer.recv().await.ok()?;
            let parts: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
            // vLLM's [b"", topic, seq, payload]; [b"", seq, payload] and
            // [seq, payload] from publishers that leave out topic or delimiter.
            let (seq, payload) = match parts.as_slice() {
                [[], _, seq, payload] | [[], seq, payload] | [seq, payload] => {
                    (wire::seq(seq).ok()?, *payload)
                }
                _ => return None,
            };
            if seq == END_OF_REPLAY {
                break;
            }
            if seq < next || to.is_some_and(|to| seq >= to) {
                continue;
            }
            if seq > next {
                // The buffer starts later than asked: history is missing.
                short = true;
                if from > 0 {
                    // A gap's batches are useless without the ones before.
                    return Some(Replayed::Short);
                }
            }
            apply(feed, payload);
            *applied_ref = Some(seq);
            next = seq + 1;
        }
        Some(if short || to.is_some_and(|to| next < to) {
            Replayed::Short
        } else {
            Replayed::Whole(next - from)
        })
    };
    let outcome = tokio::time::timeout(REPLAY_TIMEOUT, work)
        .await
        .ok()
        .flatten()
        .unwrap_or(Replayed::Unavailable);
    (outcome, applied)
}
