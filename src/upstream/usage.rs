//! Reads `usage` (prompt, cached and completion tokens) out of a response as it passes,
//! without buffering or delaying a byte.
//!
//! Written by hand because no crate parses JSON incrementally across
//! arbitrary SSE chunk boundaries at this cost: we only look for three keys.
//! The last value seen wins, so a window re-scanned across a chunk boundary
//! can only repeat or correct what was found, never double-count.

use std::sync::LazyLock;

use memchr::memmem::Finder;

/// What every usage key ends with: one forward search finds them all, and
/// the name before it says which (`prompt_tokens`, `cached_tokens`, …).
const SUFFIX: &[u8] = b"_tokens\":";
/// Built once: building a searcher per search was most of the cost.
static FIND: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(SUFFIX));
/// The longest name before the suffix (`cache_creation_input`), and its quote.
const LONGEST_NAME: usize = 21;

/// Which count a key holds.
#[derive(Clone, Copy)]
enum Key {
    /// `prompt_tokens`; the Responses and Messages APIs' `input_tokens`.
    Prompt,
    /// `completion_tokens`; `output_tokens`.
    Completion,
    /// `cached_tokens` (OpenAI's `prompt_tokens_details`).
    Cached,
    /// The Messages API's cached prompt tokens. There `input_tokens` counts
    /// only the rest: the prompt is `input + cache_read + cache_creation`
    /// (vLLM's `_build_anthropic_usage` follows Anthropic's definition).
    CacheRead,
    CacheCreation,
}

impl Key {
    fn of(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"prompt" | b"input" => Self::Prompt,
            b"completion" | b"output" => Self::Completion,
            b"cached" => Self::Cached,
            b"cache_read_input" => Self::CacheRead,
            b"cache_creation_input" => Self::CacheCreation,
            _ => return None,
        })
    }
}

/// Longest pattern plus room for a 20-digit number and whitespace.
const TAIL: usize = 64;

/// Tokens an upstream reported for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The answer said how many were cached (vLLM only does with
    /// `--enable-prompt-tokens-details`); else `cached_tokens` is 0.
    pub cached_reported: bool,
    /// 0 when the usage object did not say.
    pub completion_tokens: u64,
}

#[derive(Debug, Default)]
pub struct UsageScanner {
    prompt: Option<u64>,
    cached: Option<u64>,
    completion: Option<u64>,
    /// Messages API: `cache_read_input_tokens`, `cache_creation_input_tokens`.
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
    tail: Vec<u8>,
}

impl UsageScanner {
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.tail.is_empty() {
            let mut window = std::mem::take(&mut self.tail);
            window.extend_from_slice(&chunk[..chunk.len().min(TAIL)]);
            self.scan(&window);
        }
        self.scan(chunk);
        self.tail.clear();
        self.tail
            .extend_from_slice(&chunk[chunk.len().saturating_sub(TAIL)..]);
    }

    fn scan(&mut self, hay: &[u8]) {
        for at in FIND.find_iter(hay) {
            let before = &hay[at.saturating_sub(LONGEST_NAME)..at];
            let Some(quote) = memchr::memrchr(b'"', before) else {
                continue;
            };
            let Some(key) = Key::of(&before[quote + 1..]) else {
                continue;
            };
            let Some(v) = number_at(&hay[at + SUFFIX.len()..]) else {
                continue;
            };
            // The last value seen wins.
            let slot = match key {
                Key::Prompt => &mut self.prompt,
                Key::Completion => &mut self.completion,
                Key::Cached => &mut self.cached,
                Key::CacheRead => &mut self.cache_read,
                Key::CacheCreation => &mut self.cache_creation,
            };
            *slot = Some(v);
        }
    }

    /// What was reported, if the response carried a usage object.
    pub fn usage(&self) -> Option<Usage> {
        let anthropic = self.cache_read.is_some() || self.cache_creation.is_some();
        self.prompt.map(|p| match anthropic {
            false => Usage {
                prompt_tokens: p,
                cached_tokens: self.cached.unwrap_or(0),
                cached_reported: self.cached.is_some(),
                completion_tokens: self.completion.unwrap_or(0),
            },
            true => {
                let read = self.cache_read.unwrap_or(0);
                Usage {
                    prompt_tokens: p
                        .saturating_add(read)
                        .saturating_add(self.cache_creation.unwrap_or(0)),
                    cached_tokens: read,
                    cached_reported: self.cache_read.is_some(),
                    completion_tokens: self.completion.unwrap_or(0),
                }
            }
        })
    }
}

/// The number a key's value starts with, after any whitespace.
fn number_at(rest: &[u8]) -> Option<u64> {
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &rest[start..];
    let end = rest
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_usage_in_one_body() {
        let mut s = UsageScanner::default();
        s.feed(br#"{"usage":{"prompt_tokens": 1200,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1024}}}"#);
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt_tokens: 1200,
                cached_tokens: 1024,
                cached_reported: true,
                completion_tokens: 5,
            })
        );
    }

    #[test]
    fn survives_any_chunk_boundary() {
        let body = br#"data: {"choices":[]}

data: {"choices":[],"usage":{"prompt_tokens":98765,"completion_tokens":321,"prompt_tokens_details":{"cached_tokens":43210}}}

data: [DONE]

"#;
        for cut in 1..body.len() {
            let mut s = UsageScanner::default();
            s.feed(&body[..cut]);
            s.feed(&body[cut..]);
            assert_eq!(
                s.usage(),
                Some(Usage {
                    prompt_tokens: 98765,
                    cached_tokens: 43210,
                    cached_reported: true,
                    completion_tokens: 321,
                }),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn reads_the_responses_api_usage() {
        let mut s = UsageScanner::default();
        s.feed(br#"data: {"type":"response.completed","response":{"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":47}}}"#);
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt_tokens: 40,
                cached_tokens: 32,
                cached_reported: true,
                completion_tokens: 7
            })
        );
    }

    #[test]
    fn reads_the_messages_api_usage_where_input_excludes_the_cached() {
        let stream = br#"event: message_start
data: {"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":40,"output_tokens":0,"cache_read_input_tokens":960}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":40,"output_tokens":12,"cache_read_input_tokens":960}}

"#;
        let want = Usage {
            prompt_tokens: 1000,
            cached_tokens: 960,
            cached_reported: true,
            completion_tokens: 12,
        };
        for cut in (1..stream.len()).step_by(7) {
            let mut s = UsageScanner::default();
            s.feed(&stream[..cut]);
            s.feed(&stream[cut..]);
            assert_eq!(s.usage(), Some(want), "cut at {cut}");
        }
        // Without prompt-token details vLLM sends no cache fields: nothing known cached.
        let mut s = UsageScanner::default();
        s.feed(br#"{"type":"message","usage":{"input_tokens":7,"output_tokens":3}}"#);
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt_tokens: 7,
                cached_tokens: 0,
                cached_reported: false,
                completion_tokens: 3
            })
        );
    }

    #[test]
    fn no_usage_is_none() {
        let mut s = UsageScanner::default();
        s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n");
        assert_eq!(s.usage(), None);
    }
}
