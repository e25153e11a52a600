//! Time to first token, seen in a streamed answer as it passes: the first SSE
//! `data:` event of chat, completions and native streams (vLLM sends its first
//! chunk after prefill); for the Responses API the first `*.delta` event
//! (its `response.created` and `response.in_progress` come before any token),
//! for the Messages API the first `*_delta` (`content_block_delta`; its
//! `message_start`, `content_block_start` and `ping` may come before).
//!
//! After it, the gap between tokens: the time from the first event after the
//! first token to the [`GAP_EVENTS`]th event after that one, over that count,
//! is one engine step (each step gives every decoding sequence a token) — a
//! sample of the instance's pace before its fit stands
//! (`kvgate_routing::pace`). It starts one event late because that event may
//! come with the first at once: vLLM's chat stream sends a role-only chunk and
//! then the first token's, and an event split across reads ends in the next.
//! Taken only from a stream that went on for [`TRAILING`] events more, so that
//! the events that close a stream together (a finish chunk, usage, `[DONE]`;
//! Messages' and Responses' stop and done events) are never counted as steps;
//! and not when a chunk in the window carried two events or more (read late,
//! their times say nothing of the engine's), nor when an event names a choice
//! other than the first (`n` > 1 gives each choice an event a step; a second
//! tool call costs a sample, no more).
//!
//! Hand-written for the same reason as [`super::usage`]: two byte patterns,
//! looked for across chunk boundaries, without holding a byte back.

use std::time::{Duration, Instant};

use memchr::memmem;

const DATA: &[u8] = b"data:";
const TYPE: &[u8] = b"\"type\":\"";
/// Enough for `"type":"response.reasoning_summary_text.delta"`.
const TAIL: usize = 64;
/// Events whose mean gap is a step (after the first event after the first token).
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
    /// Events since the first token, and when the first of them came.
    later: u32,
    window_start: Option<Instant>,
    /// From that event to the [`GAP_EVENTS`]th after it.
    to_gap_events: Option<Duration>,
    /// Two events or more came in one chunk in the window, or an event named
    /// a choice other than the first: no step to read.
    unreadable: bool,
}

impl FirstToken {
    pub fn new(event: TokenEvent) -> Self {
        Self {
            event,
            seen: false,
            tail: Vec::new(),
            later: 0,
            window_start: None,
            to_gap_events: None,
            unreadable: false,
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
            self.tail = Vec::new();
        }
        self.seen
    }

    fn count_later(&mut self, chunk: &[u8], now: Instant) {
        let window_end = 1 + GAP_EVENTS;
        if self.later >= window_end + TRAILING {
            return;
        }
        // An event ends at a blank line; a JSON string holds no raw newline.
        let ends =
            memmem::find_iter(chunk, b"\n\n").count() + memmem::find_iter(chunk, b"\n\r\n").count();
        if (ends > 1 && self.later < window_end) || names_another_choice(chunk) {
            self.unreadable = true;
        }
        let before = self.later;
        self.later = before.saturating_add(u32::try_from(ends).unwrap_or(u32::MAX));
        if before == 0 && self.later >= 1 {
            self.window_start = Some(now);
        }
        if self.later >= window_end && self.to_gap_events.is_none() {
            self.to_gap_events = self.window_start.map(|t| now.saturating_duration_since(t));
        }
    }

    /// The stream's gap between tokens, once it has gone on long enough to
    /// tell (see the module's docs).
    pub fn gap(&self) -> Option<Duration> {
        if self.later < 1 + GAP_EVENTS + TRAILING || self.unreadable {
            return None;
        }
        self.to_gap_events.map(|d| d / GAP_EVENTS)
    }
}

/// An `"index":` member above 0: a choice other than the first (or a tool
/// call after the first, which only costs the sample).
fn names_another_choice(chunk: &[u8]) -> bool {
    memmem::find_iter(chunk, b"\"index\":").any(|at| {
        chunk[at + 8..]
            .iter()
            .find(|b| **b != b' ')
            .is_some_and(|b| (b'1'..=b'9').contains(b))
    })
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
        let token = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
        let mut f = FirstToken::new(TokenEvent::Data);
        // vLLM's chat: a role-only chunk, the first token's at once, then
        // tokens every 40 ms.
        assert!(f.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", at(500)));
        assert!(!f.feed(token, at(501)));
        for (n, ms) in [541, 581, 621, 661].into_iter().enumerate() {
            assert!(!f.feed(token, at(ms)));
            assert_eq!(f.gap(), None, "after {} more: too few to tell", n + 1);
        }
        for ms in [701, 741, 781] {
            f.feed(token, at(ms));
        }
        // Two in one chunk, past the window (the reader was late).
        f.feed(&[&token[..], &token[..]].concat(), at(821));
        assert_eq!(f.gap(), None, "ten events after the first: one short");
        f.feed(b"data: [DONE]\r\n\r\n", at(822));
        assert_eq!(f.gap(), Some(Duration::from_millis(40)));

        // Two tokens, then the events that close a stream at once: no gap.
        let mut short = FirstToken::new(TokenEvent::Data);
        short.feed(token, at(0));
        short.feed(token, at(40));
        short.feed(b"data: {\"choices\":[{\"finish_reason\":\"stop\"}]}\n\ndata: {\"usage\":{}}\n\ndata: [DONE]\n\n", at(41));
        assert_eq!(short.gap(), None);

        // Tokens read late, two to a chunk: not a step.
        let two = [&token[..], &token[..]].concat();
        let mut late = FirstToken::new(TokenEvent::Data);
        late.feed(token, at(0));
        for ms in [80, 160, 240, 320, 400, 480] {
            late.feed(&two, at(ms));
        }
        assert_eq!(late.gap(), None);

        // `n`: 2, an event a choice a step: not a step each.
        let second = b"data: {\"choices\":[{\"index\": 1,\"delta\":{\"content\":\"b\"}}]}\n\n";
        let mut two_choices = FirstToken::new(TokenEvent::Data);
        two_choices.feed(token, at(0));
        for k in 1..=12 {
            two_choices.feed(second, at(k * 40));
            two_choices.feed(token, at(k * 40 + 1));
        }
        assert_eq!(two_choices.gap(), None);
    }
}
