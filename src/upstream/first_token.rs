//! Time to first token, seen in a streamed answer as it passes: the first SSE
//! `data:` event of chat, completions and native streams (vLLM sends its first
//! chunk after prefill); for the Responses API the first `*.delta` event
//! (its `response.created` and `response.in_progress` come before any token),
//! for the Messages API the first `*_delta` (`content_block_delta`; its
//! `message_start`, `content_block_start` and `ping` may come before).
//!
//! After it, the gap between tokens: the time from the first token to the
//! [`GAP_EVENTS`]th event after it, over that count, is one engine step (each
//! step gives every decoding sequence a token) — a sample of the instance's
//! pace before its fit stands (`kvgate_routing::pace`). Taken only from a
//! stream that went on for [`TRAILING`] events more, so that the events that
//! close a stream together (a finish chunk, usage, `[DONE]`; Messages' and
//! Responses' stop and done events) are never counted as steps; and not
//! when a chunk before the [`GAP_EVENTS`]th carried two events or more (read
//! late, their times say nothing of the engine's).
//!
//! Hand-written for the same reason as [`super::usage`]: two byte patterns,
//! looked for across chunk boundaries, without holding a byte back.

use std::time::{Duration, Instant};

use memchr::memmem;

const DATA: &[u8] = b"data:";
const TYPE: &[u8] = b"\"type\":\"";
/// Enough for `"type":"response.reasoning_summary_text.delta"`.
const TAIL: usize = 64;
/// Events after the first token whose mean gap is a step.
pub const GAP_EVENTS: u32 = 4;
/// Events a stream must go on for after those, for them to have been tokens.
pub const TRAILING: u32 = 6;

/// Which event counts as the first token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenEvent {
    /// Any `data:` event.
    Data,
    /// An event whose `type` ends in `.delta` (Responses API) or `_delta`
    /// (Messages API).
    Delta,
}

#[derive(Debug)]
pub struct FirstToken {
    event: TokenEvent,
    seen: bool,
    tail: Vec<u8>,
    /// When the first token came, and events since.
    first_at: Option<Instant>,
    later: u32,
    /// From the first token to the [`GAP_EVENTS`]th event after it.
    to_gap_events: Option<Duration>,
    /// Two events or more came in one chunk before that.
    coalesced: bool,
}

impl FirstToken {
    pub fn new(event: TokenEvent) -> Self {
        Self {
            event,
            seen: false,
            tail: Vec::new(),
            first_at: None,
            later: 0,
            to_gap_events: None,
            coalesced: false,
        }
    }

    /// True exactly once: on the chunk, come at `now`, that carries the first token.
    pub fn feed(&mut self, chunk: &[u8], now: Instant) -> bool {
        if self.seen {
            self.count_later(chunk, now);
            return false;
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(chunk);
        self.seen = match self.event {
            TokenEvent::Data => memmem::find(&window, DATA).is_some(),
            TokenEvent::Delta => has_delta_type(&window),
        };
        self.tail = window[window.len().saturating_sub(TAIL)..].to_vec();
        if self.seen {
            self.first_at = Some(now);
            self.tail = Vec::new();
        }
        self.seen
    }

    fn count_later(&mut self, chunk: &[u8], now: Instant) {
        if self.later >= GAP_EVENTS + TRAILING {
            return;
        }
        // An event ends at a blank line; a JSON string holds no raw newline.
        let ends =
            memmem::find_iter(chunk, b"\n\n").count() + memmem::find_iter(chunk, b"\n\r\n").count();
        if ends > 1 && self.later < GAP_EVENTS {
            self.coalesced = true;
        }
        self.later = self
            .later
            .saturating_add(u32::try_from(ends).unwrap_or(u32::MAX));
        if self.later >= GAP_EVENTS && self.to_gap_events.is_none() {
            self.to_gap_events = self.first_at.map(|t| now.saturating_duration_since(t));
        }
    }

    /// The stream's gap between tokens, once it has gone on long enough to
    /// tell (see the module's docs).
    pub fn gap(&self) -> Option<Duration> {
        if self.later < GAP_EVENTS + TRAILING || self.coalesced {
            return None;
        }
        self.to_gap_events.map(|d| d / GAP_EVENTS)
    }
}

/// A `"type":"….delta"` or `"type":"…_delta"` member. Client text cannot forge one: a quote inside a
/// JSON string is escaped, so `"type":"` only matches a real member.
fn has_delta_type(hay: &[u8]) -> bool {
    memmem::find_iter(hay, TYPE).any(|at| {
        let rest = &hay[at + TYPE.len()..];
        rest.iter().position(|&b| b == b'"').is_some_and(|end| {
            let ty = &rest[..end];
            ty.ends_with(b".delta") || ty.ends_with(b"_delta")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_streams_count_the_first_content_delta() {
        let mut f = FirstToken::new(TokenEvent::Delta);
        assert!(!f.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[]}}\n\n", Instant::now()));
        assert!(!f.feed(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n", Instant::now()));
        assert!(!f.feed(
            b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
            Instant::now()
        ));
        assert!(!f.feed(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_",
            Instant::now()
        ));
        assert!(f.feed(b"delta\",\"index\":0}\n\n", Instant::now()));
    }

    #[test]
    fn chat_streams_count_the_first_data_event() {
        let mut f = FirstToken::new(TokenEvent::Data);
        assert!(!f.feed(b": ping\n\n", Instant::now()));
        assert!(!f.feed(b"da", Instant::now()));
        assert!(f.feed(b"ta: {\"choices\":[]}\n\n", Instant::now()));
        assert!(!f.feed(b"data: {}\n\n", Instant::now()), "only once");
    }

    #[test]
    fn responses_streams_count_the_first_delta_at_any_cut() {
        let body = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"instructions\":\"say \\\"type\\\":\\\"x.delta\\\"\"}}\n\n\
                    event: response.output_text.delta\ndata: {\"delta\":\"Hi\",\"type\":\"response.output_text.delta\"}\n\n";
        let created_end = body.find("\n\n").unwrap() + 2;
        for cut in 1..body.len() {
            let mut f = FirstToken::new(TokenEvent::Delta);
            let a = f.feed(&body.as_bytes()[..cut], Instant::now());
            let b = f.feed(&body.as_bytes()[cut..], Instant::now());
            assert!(a != b, "cut {cut}: exactly one chunk carries it");
            if cut <= created_end {
                assert!(b, "cut {cut}: created is no token");
            }
        }
    }

    #[test]
    fn the_gap_between_tokens_counts_only_a_stream_that_went_on() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
        let mut f = FirstToken::new(TokenEvent::Data);
        assert!(f.feed(token, at(500)));
        // Tokens every 40 ms.
        for (n, ms) in [540, 580, 620, 660].into_iter().enumerate() {
            assert!(!f.feed(token, at(ms)));
            assert_eq!(f.gap(), None, "after {n} more: too few to tell");
        }
        for ms in [700, 740, 780] {
            f.feed(token, at(ms));
        }
        // Two in one chunk (the reader was late).
        f.feed(&[&token[..], &token[..]].concat(), at(820));
        assert_eq!(f.gap(), None, "nine events after the first: one short");
        f.feed(b"data: [DONE]\r\n\r\n", at(821));
        assert_eq!(f.gap(), Some(Duration::from_millis(40)));

        // Two tokens, then the events that close a stream at once: no gap.
        let mut short = FirstToken::new(TokenEvent::Data);
        short.feed(token, at(0));
        short.feed(token, at(40));
        short.feed(b"data: {\"choices\":[{\"finish_reason\":\"stop\"}]}\n\ndata: {\"usage\":{}}\n\ndata: [DONE]\n\n", at(41));
        assert_eq!(short.gap(), None);

        // Tokens read late, two to a chunk: not a step.
        let mut late = FirstToken::new(TokenEvent::Data);
        late.feed(token, at(0));
        let two = [&token[..], &token[..]].concat();
        for ms in [80, 160, 240, 320, 400] {
            late.feed(&two, at(ms));
        }
        assert_eq!(late.gap(), None);
    }
}
