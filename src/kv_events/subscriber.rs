//! The task that follows one publisher: a ZeroMQ SUB socket on vLLM's
//! `--kv-events-config` endpoint, sequence tracking, catching up from its
//! replay socket ([`replay`]), and shedding when events come faster than
//! they can be applied.
//!
//! Sequence rules (vLLM numbers batches from 0, +1 each):
//! - the next number: apply;
//! - a jump ahead: a gap. Replay exactly the missing batches, then apply the
//!   one received. If replay is not configured or its buffer no longer
//!   reaches back to the gap, the index is cleared and marked partial: one
//!   that missed removals would overstate what the instance holds;
//! - a number not above the last: the publisher restarted (its numbering
//!   began again, its cache is empty): reset, and catch up from batch 0.
//!
//! First contact — on subscribing, and again after every reconnection — starts
//! from an empty index and reads the replay buffer from batch 0 at once, so
//! that a restarted engine that publishes nothing, or a gateway started beside
//! a busy fleet, knows what the engine holds before its next step. The
//! connection is this task's own: when the monitor reports the publisher gone,
//! the socket is dropped and a new one connects (every 250 ms, never the
//! socket's own back-off of up to 30 s), so an engine that comes back at the
//! same address is followed within a second of its return. While any
//! catch-up runs, the instance is routed as unknown (`Trust::Replaying`).
//!
//! Overload: a gap soon after the last catch-up means the publisher is
//! dropping batches because this task does not keep up, and replaying each
//! gap would only deepen it. Then the task sheds: it reads batches off the
//! socket without applying them (counted), for a hold that doubles with each
//! consecutive episode, until the socket is drained, and recovers once with
//! one replay of everything it shed (or, if the buffer moved on, from what
//! the buffer still holds).
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use zeromq::{Socket, SocketEvent, SocketRecv, ZmqMessage};

use super::feed::Feed;
use super::replay::{Replayed, replay};
use super::wire;

/// How long one attempt to connect may take.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(1);
/// Pause between attempts to reach a publisher that is down.
const RETRY: Duration = Duration::from_millis(250);
/// A gap within this long of the last catch-up means ingestion is behind.
const OVERLOAD: Duration = Duration::from_secs(2);
/// The first shedding hold; it doubles per consecutive episode, up to 64×.
const HOLD: Duration = Duration::from_millis(250);
/// Most batches shed in one go before yielding.
const DRAIN: usize = 4096;

/// Follow `feed`'s publisher until the task is aborted.
pub async fn run(feed: Arc<Feed>) {
    loop {
        if let Some((sub, monitor)) = connect(&feed.events_url).await {
            tracing::info!(events = %feed.events_url, "subscribed to KV events");
            follow(&feed, sub, monitor).await;
            feed.set_connected(false);
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn connect(
    url: &str,
) -> Option<(
    zeromq::SubSocket,
    impl futures_util::Stream<Item = SocketEvent> + Unpin,
)> {
    let mut sub = zeromq::SubSocket::new();
    let monitor = sub.monitor();
    tokio::time::timeout(CONNECT_ATTEMPT, sub.connect(url))
        .await
        .ok()?
        .ok()?;
    sub.subscribe("").await.ok()?;
    Some((sub, monitor))
}

/// Whether a monitor event means the publisher is gone.
fn gone(feed: &Feed, ev: Option<SocketEvent>) -> bool {
    match ev {
        Some(SocketEvent::Disconnected(_)) | None => {
            tracing::warn!(events = %feed.events_url, "KV event publisher disconnected; approximate index until it is back and replayed");
            true
        }
        Some(_) => false,
    }
}

/// Follow one connection until the publisher goes away.
async fn follow(
    feed: &Feed,
    mut sub: zeromq::SubSocket,
    mut monitor: impl futures_util::Stream<Item = SocketEvent> + Unpin,
) {
    // Unknown until the history is read: set before the feed counts as connected.
    feed.catching_up(true);
    feed.set_connected(true);
    let mut s = Sequence::default();
    s.first_contact(feed).await;
    loop {
        if let Some(until) = s.shedding.map(|sh| sh.until) {
            if Instant::now() < until {
                tokio::select! {
                    msg = sub.recv() => match msg {
                        Ok(m) => s.shed(feed, &m),
                        Err(_) => return,
                    },
                    () = tokio::time::sleep_until(until.into()) => {}
                    ev = monitor.next() => if gone(feed, ev) { return },
                }
                continue;
            }
            // The hold is over: drain what is queued, then recover once. A
            // socket still not drained after a bounded drain sheds on (and
            // lets the other feeds on this thread run meanwhile).
            let mut still_full = true;
            for _ in 0..DRAIN {
                match sub.recv().now_or_never() {
                    Some(Ok(m)) => s.shed(feed, &m),
                    Some(Err(_)) => return,
                    None => {
                        still_full = false;
                        break;
                    }
                }
            }
            if still_full {
                s.hold_on(HOLD);
                tokio::task::yield_now().await;
                continue;
            }
            s.recover(feed).await;
            continue;
        }
        tokio::select! {
            msg = sub.recv() => match msg {
                Ok(m) => s.on_message(feed, &m).await,
                Err(e) => {
                    tracing::warn!(events = %feed.events_url, error = %e, "KV event subscription failed; resubscribing");
                    return;
                }
            },
            ev = monitor.next() => if gone(feed, ev) { return },
        }
    }
}

fn frames(m: &ZmqMessage) -> Result<(u64, &[u8]), wire::WireError> {
    match (m.len(), m.get(1), m.get(2)) {
        (3, Some(seq), Some(payload)) => Ok((wire::seq(seq)?, payload)),
        (n, ..) => Err(wire::WireError::Frames(n)),
    }
}

#[derive(Debug, Clone, Copy)]
struct Shedding {
    /// The first batch not applied.
    from: u64,
    /// The last batch shed.
    through: u64,
    /// Shed at least until then.
    until: Instant,
}

#[derive(Debug, Default)]
struct Sequence {
    /// The last batch applied.
    last: Option<u64>,
    /// Batches up to this one were applied by a replay (they may still be
    /// queued on the socket).
    skip_through: Option<u64>,
    shedding: Option<Shedding>,
    /// When the last gap catch-up or recovery ended.
    caught_up: Option<Instant>,
    /// Consecutive shedding episodes (each doubles the hold).
    episodes: u32,
}

impl Sequence {
    /// Read the whole replay buffer into an emptied index.
    async fn first_contact(&mut self, feed: &Feed) {
        feed.start_over();
        let r = replay(feed, 0, None, true).await;
        match r.outcome {
            Replayed::Whole(n) if n > 0 => {
                feed.sequence("replay");
                tracing::info!(events = %feed.events_url, batches = n, chunks = r.chunks, "KV events replayed on subscribing");
            }
            Replayed::Short => feed.partial(false, Instant::now()),
            // Nothing published yet, or no replay socket: the first batch decides.
            Replayed::Whole(_) | Replayed::Unavailable => {}
        }
        feed.catching_up(false);
        self.last = r.last;
        self.skip_through = r.last;
    }

    async fn on_message(&mut self, feed: &Feed, m: &ZmqMessage) {
        let (seq, payload) = match frames(m) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(events = %feed.events_url, error = %e, "malformed KV event message");
                feed.malformed();
                return;
            }
        };
        match self.skip_through {
            Some(done) if seq <= done => return,
            Some(_) => self.skip_through = None,
            None => {}
        }
        match self.last {
            Some(l) if seq == l.wrapping_add(1) => {}
            Some(l) if seq > l => {
                feed.sequence("gap");
                tracing::warn!(events = %feed.events_url, from = l + 1, to = seq, "KV event gap");
                if self.caught_up.is_some_and(|t| t.elapsed() < OVERLOAD) {
                    self.start_shedding(feed, l + 1, seq);
                    return;
                }
                self.catch_up(feed, l + 1, seq, false).await;
            }
            Some(l) => {
                tracing::info!(events = %feed.events_url, seq, last = l, "KV event publisher restarted; resetting its index");
                feed.reset();
                self.catch_up(feed, 0, seq, true).await;
            }
            // First contact found nothing to replay: catch up to this batch.
            None if seq > 0 => self.catch_up(feed, 0, seq, true).await,
            None => {}
        }
        self.last = Some(seq);
        // The console's "last sequence number".
        feed.counters
            .next_seq
            .store(seq.wrapping_add(1), std::sync::atomic::Ordering::Relaxed);
        feed.apply_payload(payload);
    }

    /// Replay `from..to`; `fresh`: the index starts empty there.
    async fn catch_up(&mut self, feed: &Feed, from: u64, to: u64, fresh: bool) {
        feed.catching_up(true);
        let r = replay(feed, from, Some(to), fresh).await;
        match r.outcome {
            Replayed::Whole(n) => {
                feed.sequence("replay");
                tracing::info!(events = %feed.events_url, batches = n, chunks = r.chunks, "KV events replayed");
            }
            // What was missed may include removals: a gap's index is cleared.
            Replayed::Short | Replayed::Unavailable => feed.partial(!fresh, Instant::now()),
        }
        feed.catching_up(false);
        self.caught_up = Some(Instant::now());
    }

    fn start_shedding(&mut self, feed: &Feed, from: u64, seq: u64) {
        if self.caught_up.is_some_and(|t| t.elapsed() > OVERLOAD * 10) {
            self.episodes = 0;
        }
        let hold = HOLD * (1 << self.episodes.min(6));
        self.episodes += 1;
        tracing::warn!(events = %feed.events_url, from, hold = ?hold, "KV events arrive faster than they are applied; shedding at the socket, then recovering once");
        feed.catching_up(true);
        feed.shed();
        self.shedding = Some(Shedding {
            from,
            through: seq,
            until: Instant::now() + hold,
        });
    }

    /// Shed for `more` before trying to drain again.
    fn hold_on(&mut self, more: Duration) {
        if let Some(sh) = self.shedding.as_mut() {
            sh.until = Instant::now() + more;
        }
    }

    fn shed(&mut self, feed: &Feed, m: &ZmqMessage) {
        feed.shed();
        if let (Ok((seq, _)), Some(sh)) = (frames(m), self.shedding.as_mut()) {
            sh.through = sh.through.max(seq);
        }
    }

    /// Replay what was shed, once; if the buffer no longer has it, start over
    /// from what it holds.
    async fn recover(&mut self, feed: &Feed) {
        let Some(sh) = self.shedding.take() else {
            return;
        };
        let r = replay(feed, sh.from, Some(sh.through + 1), false).await;
        match r.outcome {
            Replayed::Whole(n) => {
                feed.sequence("replay");
                tracing::info!(events = %feed.events_url, batches = n, chunks = r.chunks, "KV events recovered after shedding");
            }
            Replayed::Short | Replayed::Unavailable => {
                feed.reset();
                let again = replay(feed, 0, Some(sh.through + 1), true).await;
                if !matches!(again.outcome, Replayed::Whole(_)) {
                    feed.partial(false, Instant::now());
                }
            }
        }
        self.last = Some(sh.through);
        self.skip_through = None;
        feed.catching_up(false);
        self.caught_up = Some(Instant::now());
    }
}
