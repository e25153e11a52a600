//! Reading a span of a publisher's history from its replay socket (vLLM's
//! ROUTER: `[b"", start (8 bytes BE)]` is answered by every buffered batch
//! from `start` on, then an end marker of seq −1), applying each batch as it
//! comes.
//!
//! The protocol cannot say where to stop, so the reader stops itself: at the
//! gap's end it closes the socket, and the publisher's sends to it are
//! dropped. It also cannot promise the answer is whole: vLLM's ROUTER leaves
//! ZeroMQ's send high-water mark at 1,000 messages, so a long answer loses
//! batches (and often the end marker) when the publisher writes faster than
//! the socket drains. A batch numbered past the one expected, after the first,
//! or an answer that stalls, is such a loss: the reader asks again from the
//! batch it needs next, in as many chunks as it takes, within a time budget.
//! Only a first answer that starts past the batch asked for means the history
//! itself is gone. An answer long enough to have met the limit is confirmed
//! by one more request from where it ended, since its tail may have been lost
//! while the end marker got through.

use std::time::{Duration, Instant};

use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::feed::Feed;
use super::wire::{self, END_OF_REPLAY};

/// How long the first answer to a request may take (connecting included).
const FIRST_ANSWER: Duration = Duration::from_secs(2);
/// Longest pause between two batches of one answer before it counts as stalled.
const STALL: Duration = Duration::from_millis(500);
/// How long one replay, all its chunks together, may take.
const BUDGET: Duration = Duration::from_secs(30);
/// An answer this long may have lost its tail to the high-water mark and
/// still ended with the end marker (the queue drained in time for it): it is
/// confirmed by asking once more from the batch after it.
const LONG_ANSWER: u64 = 500;

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Every batch asked for, applied (how many).
    Whole(u64),
    /// History is missing: the buffer no longer reaches back to the start, or
    /// the budget ran out. What was applied is in `Replay::last`.
    Short,
    /// No replay socket, or it never answered.
    Unavailable,
}

#[derive(Debug, Clone, Copy)]
pub struct Replay {
    pub outcome: Replayed,
    /// The last batch applied, if any.
    pub last: Option<u64>,
    /// Requests it took.
    pub chunks: u32,
}

/// How one request's answer ended.
enum Chunk {
    /// The batch before `to` was applied; the rest of the answer is not read.
    Reached,
    /// The end marker: the buffer has nothing after the last batch applied.
    End,
    /// The answer began past the batch asked for: that history is gone.
    Missing(u64),
    /// Batches were lost on the way (a jump after the first, or a stall).
    Lost,
    /// No answer at all.
    Silent,
}

/// Replay batches `from..to` (`None`: to the end of the buffer), applying
/// each. `skip_missing`: the index started empty (first contact), so a buffer
/// that begins later is applied from where it begins (and the replay is
/// `Short`); a gap's batches are useless without the ones before, so
/// otherwise missing history ends it.
pub async fn replay(feed: &Feed, from: u64, to: Option<u64>, skip_missing: bool) -> Replay {
    let mut r = Replay {
        outcome: Replayed::Unavailable,
        last: None,
        chunks: 0,
    };
    let Some(url) = feed.replay_url.as_deref() else {
        return r;
    };
    if to.is_some_and(|to| to <= from) {
        r.outcome = Replayed::Whole(0);
        return r;
    }
    let deadline = Instant::now() + BUDGET;
    let mut next = from;
    let mut short = false;
    loop {
        r.chunks += 1;
        let asked = next;
        let chunk = tokio::time::timeout_at(
            deadline.into(),
            chunk(feed, url, &mut next, to, &mut r.last),
        )
        .await
        .unwrap_or(Chunk::Lost);
        match chunk {
            Chunk::Reached => break,
            Chunk::End if next - asked >= LONG_ANSWER => {}
            Chunk::End if to.is_none_or(|to| next >= to) => break,
            // The buffer ends before the batch that revealed the gap: it was
            // restarted or cleared meanwhile.
            Chunk::End => {
                short = true;
                break;
            }
            Chunk::Missing(first) if skip_missing => {
                short = true;
                next = first;
                if to.is_some_and(|to| next >= to) {
                    break;
                }
                continue;
            }
            Chunk::Missing(_) => {
                r.outcome = Replayed::Short;
                return r;
            }
            Chunk::Silent if r.last.is_none() && r.chunks == 1 => return r,
            Chunk::Lost | Chunk::Silent => {}
        }
        if Instant::now() >= deadline {
            short = true;
            tracing::warn!(events = %feed.events_url, from, next, "KV event replay ran out of time");
            break;
        }
        if r.chunks > 1 && r.chunks.is_power_of_two() {
            tracing::info!(events = %feed.events_url, from, next, chunks = r.chunks, "KV event replay continuing where it stopped");
        }
    }
    r.outcome = if short {
        Replayed::Short
    } else {
        Replayed::Whole(next - from)
    };
    r
}

/// One request for the batches from `*next`, read until `to`, the end
/// marker, a loss or a stall; `*next` and `*last` follow what was applied.
async fn chunk(
    feed: &Feed,
    url: &str,
    next: &mut u64,
    to: Option<u64>,
    last: &mut Option<u64>,
) -> Chunk {
    let mut dealer = zeromq::DealerSocket::new();
    let asked = async {
        dealer.connect(url).await.ok()?;
        let mut req = ZmqMessage::from(Vec::<u8>::new());
        req.push_back(next.to_be_bytes().to_vec().into());
        dealer.send(req).await.ok()
    };
    if !matches!(
        tokio::time::timeout(FIRST_ANSWER, asked).await,
        Ok(Some(()))
    ) {
        return Chunk::Silent;
    }
    let mut first = true;
    loop {
        let wait = if first { FIRST_ANSWER } else { STALL };
        let m = match tokio::time::timeout(wait, dealer.recv()).await {
            Ok(Ok(m)) => m,
            _ if first => return Chunk::Silent,
            _ => return Chunk::Lost,
        };
        let parts: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
        // vLLM's [b"", topic, seq, payload]; [b"", seq, payload] and
        // [seq, payload] from publishers that leave out topic or delimiter.
        let (seq, payload) = match parts.as_slice() {
            [[], _, seq, payload] | [[], seq, payload] | [seq, payload] => match wire::seq(seq) {
                Ok(s) => (s, *payload),
                Err(_) => return Chunk::Lost,
            },
            _ => return Chunk::Lost,
        };
        let was_first = std::mem::replace(&mut first, false);
        if seq == END_OF_REPLAY {
            return Chunk::End;
        }
        if seq < *next {
            continue;
        }
        if seq > *next {
            // The first batch is never lost to the high-water mark (the
            // queue was empty): if it is late, the buffer starts there.
            return if was_first {
                Chunk::Missing(seq)
            } else {
                Chunk::Lost
            };
        }
        feed.apply_payload(payload);
        *last = Some(seq);
        *next = seq + 1;
        if to.is_some_and(|to| *next >= to) {
            return Chunk::Reached;
        }
    }
}
