//! Time to first token, seen in a streamed answer as it passes: the first SSE
//! `data:` event of chat, completions and native streams (vLLM sends its first
//! chunk after prefill); for the Responses API the first `*.delta` event
//! (its `response.created` and `response.in_progress` come before any token),
//! for the Messages API the first `*_delta` (`content_block_delta`; its
//! `message_start`, `content_block_start` and `ping` may come before).
//!
//! Hand-written for the same reason as [`super::usage`]: two byte patterns,
//! looked for across chunk boundaries, without holding a byte back.

use memchr::memmem;

const DATA: &[u8] = b"data:";
const TYPE: &[u8] = b"\"type\":\"";
/// Enough for `"type":"response.reasoning_summary_text.delta"`.
const TAIL: usize = 64;

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
}

impl FirstToken {
    pub fn new(event: TokenEvent) -> Self {
        Self {
            event,
            seen: false,
            tail: Vec::new(),
        }
    }

    /// True exactly once: on the chunk that carries the first token.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.seen {
            return false;
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(chunk);
        self.seen = match self.event {
            TokenEvent::Data => memmem::find(&window, DATA).is_some(),
            TokenEvent::Delta => has_delta_type(&window),
        };
        self.tail = window[window.len().saturating_sub(TAIL)..].to_vec();
        self.seen
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
        assert!(!f.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[]}}\n\n"));
        assert!(!f.feed(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"));
        assert!(!f.feed(b"event: ping\ndata: {\"type\": \"ping\"}\n\n"));
        assert!(!f.feed(b"event: content_block_delta\ndata: {\"type\":\"content_block_"));
        assert!(f.feed(b"delta\",\"index\":0}\n\n"));
    }

    #[test]
    fn chat_streams_count_the_first_data_event() {
        let mut f = FirstToken::new(TokenEvent::Data);
        assert!(!f.feed(b": ping\n\n"));
        assert!(!f.feed(b"da"));
        assert!(f.feed(b"ta: {\"choices\":[]}\n\n"));
        assert!(!f.feed(b"data: {}\n\n"), "only once");
    }

    #[test]
    fn responses_streams_count_the_first_delta_at_any_cut() {
        let body = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"instructions\":\"say \\\"type\\\":\\\"x.delta\\\"\"}}\n\n\
                    event: response.output_text.delta\ndata: {\"delta\":\"Hi\",\"type\":\"response.output_text.delta\"}\n\n";
        let created_end = body.find("\n\n").unwrap() + 2;
        for cut in 1..body.len() {
            let mut f = FirstToken::new(TokenEvent::Delta);
            let a = f.feed(&body.as_bytes()[..cut]);
            let b = f.feed(&body.as_bytes()[cut..]);
            assert!(a != b, "cut {cut}: exactly one chunk carries it");
            if cut <= created_end {
                assert!(b, "cut {cut}: created is no token");
            }
        }
    }
}
