//! The task that follows one publisher: a ZeroMQ SUB socket on vLLM's
//! `--kv-events-config` endpoint, sequence tracking, and replays from its
//! ROUTER socket when a batch is missed.
//!
//! Sequence rules (vLLM numbers batches from 0, +1 each):
//! - the next number: apply;
//! - a jump ahead: a gap. Ask the replay socket for the missing batches
//!   (`[b"", start (8 bytes BE)]`, answered by `[b"", seq, payload]` frames and
//!   an end marker of seq −1); apply them in order, then the one received. If
//!   replay is not configured or cannot cover the gap, reset the instance:
//!   an index that missed removals would overstate what it holds;
//! - a number not above the last: the publisher restarted (its numbering
//!   began again, its cache is empty): reset.
//!
//! On the first batch after subscribing, a publisher already running may
//! hold blocks from before; with a replay socket its buffer is read from 0.
//! The socket reconnects by itself; the monitor tells the feed when it is up.

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
        let mut last: Option<u64> = None;
        loop {
            tokio::select! {
                msg = sub.recv() => match msg {
                    Ok(m) => on_message(&feed, &mut last, &m).await,
                    Err(e) => {
                        tracing::warn!(events = %feed.events_url, error = %e, "KV event subscription failed; resubscribing");
                        break;
                    }
                },
                ev = monitor.next() => match ev {
                    Some(SocketEvent::Disconnected(_)) => {
                        feed.set_connected(false);
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

async fn on_message(feed: &Feed, last: &mut Option<u64>, m: &ZmqMessage) {
    let (seq, payload) = match frames(m) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(events = %feed.events_url, error = %e, "malformed KV event message");
            feed.malformed();
            return;
        }
    };
    let expected = match *last {
        Some(l) if seq <= l => {
            tracing::info!(events = %feed.events_url, seq, last = l, "KV event publisher restarted; resetting its index");
            feed.reset();
            None
        }
        Some(l) => Some(l + 1),
        // First batch heard: catch up on what the publisher still buffers.
        None => Some(0),
    };
    if let Some(from) = expected.filter(|&from| from < seq) {
        let first_contact = last.is_none();
        if !first_contact {
            feed.sequence("gap");
            tracing::warn!(events = %feed.events_url, from, to = seq, "KV event gap");
        }
        match replay(feed, from, seq).await {
            Some(n) => {
                feed.sequence("replay");
                tracing::info!(events = %feed.events_url, batches = n, "KV events replayed");
            }
            // Missing removals would overstate what the instance holds.
            None if !first_contact => feed.reset(),
            None => {}
        }
    }
    *last = Some(seq);
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

/// Replay batches `from..to`; the number applied, or `None` when the
/// replay socket is absent, unreachable, or no longer holds `from`.
async fn replay(feed: &Feed, from: u64, to: u64) -> Option<usize> {
    let url = feed.replay_url.as_deref()?;
    let work = async {
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(url).await.ok()?;
        let mut req = ZmqMessage::from(Vec::<u8>::new());
        req.push_back(from.to_be_bytes().to_vec().into());
        dealer.send(req).await.ok()?;
        let mut batches: Vec<(u64, Vec<u8>)> = Vec::new();
        loop {
            let m = dealer.recv().await.ok()?;
            let parts: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
            // [b"", seq, payload]; some publishers omit the empty delimiter.
            let (seq, payload) = match parts.as_slice() {
                [[], seq, payload] => (wire::seq(seq).ok()?, *payload),
                [seq, payload] => (wire::seq(seq).ok()?, *payload),
                _ => return None,
            };
            if seq == END_OF_REPLAY {
                break;
            }
            if seq >= from && seq < to {
                batches.push((seq, payload.to_vec()));
            }
        }
        Some(batches)
    };
    let batches = tokio::time::timeout(REPLAY_TIMEOUT, work).await.ok()??;
    // The buffer must still reach back to `from`, or blocks were missed.
    if batches.first().map(|b| b.0) != Some(from) && from < to {
        if from == 0 {
            // First contact: take what the buffer has.
            for (_, p) in &batches {
                apply(feed, p);
            }
            return Some(batches.len());
        }
        return None;
    }
    for (_, p) in &batches {
        apply(feed, p);
    }
    Some(batches.len())
}
