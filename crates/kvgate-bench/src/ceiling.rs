//! The reuse ceiling of the requests a run actually sent: the same bodies, in send
//! order, one at a time, to a single simulated instance whose KV cache never
//! evicts. Its hit rate is what no router over any fleet could beat. Counted
//! in 4-byte chunks, or in real token ids when given the `kv_aware` arm's
//! tokenizer (its instances count those). The same replay, counted both ways,
//! gives how many real tokens the `kv_aware` arm's instances see for each
//! 4-byte chunk the others see, held and prefilled ([`token_ratio`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use kvgate_sim::{SimConfig, spawn};
use kvgate_tokenize::PromptTokenizer;
use serde_json::Value;

/// Hit rate (cached ÷ prompt tokens) of `bodies` (each with the path it was
/// sent to) on one infinite cache that tokenizes with `tokenizer` (`None`:
/// 4-byte chunks).
pub async fn ceiling(
    bodies: &[(&'static str, Bytes)],
    tokenizer: Option<Arc<PromptTokenizer>>,
) -> anyhow::Result<f64> {
    let (cached, prompt) = replay(bodies, tokenizer).await?;
    Ok(crate::run::ratio(cached, prompt))
}

/// How many tokens `tokenizer` (as the `kv_aware` arm's instances count:
/// its chat template, its ids) makes of `bodies` for each 4-byte chunk (the
/// other arms' instances): over their whole prompts, and over what an
/// instance that never evicts must prefill (each turn's new text); (1, 1)
/// without bodies.
pub async fn token_ratio(
    bodies: &[(&'static str, Bytes)],
    tokenizer: Arc<PromptTokenizer>,
) -> anyhow::Result<(f64, f64)> {
    let (chunks_cached, chunks) = replay(bodies, None).await?;
    let (tokens_cached, tokens) = replay(bodies, Some(tokenizer)).await?;
    let ratio = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    Ok((
        ratio(tokens, chunks),
        ratio(
            tokens - tokens_cached.min(tokens),
            chunks - chunks_cached.min(chunks),
        ),
    ))
}

/// Cached and prompt tokens of `bodies` sent in order to one instance whose
/// cache never evicts.
async fn replay(
    bodies: &[(&'static str, Bytes)],
    tokenizer: Option<Arc<PromptTokenizer>>,
) -> anyhow::Result<(u64, u64)> {
    let cfg = SimConfig {
        name: "ceiling".to_owned(),
        cache_blocks: 1 << 36,
        time_scale: 0.0,
        tokenizer,
        ..SimConfig::llama70b_h100_tp4()
    };
    let sim = spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    for (path, body) in bodies {
        let mut v: Value = serde_json::from_slice(body).context("a recorded body")?;
        // One output token and no stream: only the prompt matters here.
        if let Some(obj) = v.as_object_mut() {
            obj.insert("max_tokens".to_owned(), Value::from(1));
            obj.insert("stream".to_owned(), Value::Bool(false));
            obj.remove("stream_options");
        }
        client
            .post(format!("{}{path}", sim.url()))
            .header("content-type", "application/json")
            .body(v.to_string())
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .context("ceiling instance")?
            .bytes()
            .await?;
    }
    let stats = sim.server.stats();
    sim.shutdown().await?;
    Ok((stats.cached_tokens, stats.prompt_tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(system: &str, question: &str) -> (&'static str, Bytes) {
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]});
        ("/v1/chat/completions", Bytes::from(body.to_string()))
    }

    /// A long shared system prompt of filler (one SmolLM2 token a simulated
    /// token) and short questions: over whole prompts the ratio is near 1,
    /// over what is prefilled (mostly the questions and the template's own
    /// tokens) higher; no bodies, no scaling.
    #[tokio::test]
    async fn token_ratio_counts_held_and_prefilled_text_apart() {
        let system = kvgate_sim::block_text(7, 2000);
        let bodies: Vec<_> = (0..4)
            .map(|i| chat(&system, &format!("Question {i}: what does clause {i} say?")))
            .collect();
        let tok = crate::tokenizer::shared().unwrap();
        let (held, prefilled) = token_ratio(&bodies, Arc::clone(&tok)).await.unwrap();
        assert!((0.95..1.1).contains(&held), "held {held}");
        assert!(prefilled > held, "prefilled {prefilled} held {held}");
        assert_eq!(token_ratio(&[], tok).await.unwrap(), (1.0, 1.0));
    }
}
