//! Completion tokens of a stream that reported no usage (no
//! `stream_options.include_usage`), counted from the text it streamed.
//!
//! Runs after the stream ended, on a blocking thread (see `forward.rs`):
//! tiktoken takes milliseconds on a long answer, which must never sit
//! between an upstream's bytes and the client. The encoding is `o200k_base`
//! (GPT-4o's); an open model's own tokenizer counts differently by a few
//! percent, which is what a token quota can tolerate.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::Value;

/// Tokens of the text the chunks of an OpenAI SSE stream carry: each
/// choice's `delta.content`, reasoning and tool-call arguments (chat),
/// `text` (completions) or a Responses stream's `*.delta` events, counted
/// per choice (per output).
pub fn count(chunks: &[Bytes]) -> u64 {
    let bpe = tiktoken_rs::o200k_base_singleton();
    streamed_text(chunks)
        .values()
        .map(|text| bpe.encode_ordinary(text).len() as u64)
        .sum()
}

/// The generated text of each choice, by index.
pub fn streamed_text(chunks: &[Bytes]) -> BTreeMap<u64, String> {
    let mut all = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        all.extend_from_slice(c);
    }
    let mut out: BTreeMap<u64, String> = BTreeMap::new();
    for line in String::from_utf8_lossy(&all).lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim_start) else {
            continue;
        };
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            continue; // `[DONE]`, or not JSON
        };
        // The Responses API streams its text as `response.*.delta` events
        // (output text, reasoning, function-call arguments), one output.
        if event["type"]
            .as_str()
            .is_some_and(|t| t.ends_with(".delta"))
        {
            let text = out
                .entry(event["output_index"].as_u64().unwrap_or(0))
                .or_default();
            text.push_str(event["delta"].as_str().unwrap_or_default());
            continue;
        }
        for choice in event["choices"].as_array().into_iter().flatten() {
            let text = out
                .entry(choice["index"].as_u64().unwrap_or(0))
                .or_default();
            let delta = &choice["delta"];
            let parts = [
                &choice["text"],
                &delta["content"],
                &delta["reasoning_content"],
                &delta["reasoning"],
            ];
            for part in parts {
                text.push_str(part.as_str().unwrap_or_default());
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                text.push_str(call["function"]["name"].as_str().unwrap_or_default());
                text.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_deltas_of_every_choice_across_chunk_boundaries() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\", world\"}},{\"index\":1,\"delta\":{\"content\":\"Bonjour\"}}]}\r\n\r\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        )
        .as_bytes();
        let (a, b) = stream.split_at(37);
        let chunks = [Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)];
        let text = streamed_text(&chunks);
        assert_eq!(text[&0], "Hello, world");
        assert_eq!(text[&1], "Bonjour");
        let bpe = tiktoken_rs::o200k_base_singleton();
        let want = bpe.encode_ordinary("Hello, world").len() + bpe.encode_ordinary("Bonjour").len();
        assert_eq!(count(&chunks), want as u64);
    }

    #[test]
    fn a_responses_stream_counts_its_delta_events() {
        let sse = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hello \"}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"world\"}\n\n",
        );
        let text = streamed_text(&[Bytes::from_static(sse.as_bytes())]);
        assert_eq!(text.get(&0).map(String::as_str), Some("Hello world"));
        assert!(count(&[Bytes::from_static(sse.as_bytes())]) >= 2);
    }

    #[test]
    fn completions_text_and_tool_arguments_count_too() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"text\":\"once upon\"}]}\n\n",
            "data: {\"choices\":[{\"index\":1,\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]}}]}\n\n",
        );
        let text = streamed_text(&[Bytes::from_static(stream.as_bytes())]);
        assert_eq!(text[&0], "once upon");
        assert_eq!(text[&1], "f{\"x\":1}");
        assert_eq!(count(&[Bytes::from_static(b"data: [DONE]\n\n")]), 0);
    }
}
