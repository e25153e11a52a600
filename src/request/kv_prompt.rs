//! The prompt as the engine will see it (`kv_aware`): the engine-visible
//! `cache_salt`, the chat template and tokenizer (as far as the index can
//! match), and the keys of the full blocks of those tokens.

use kvgate_prefix::Api;
use serde_json::Value;

use kvgate_routing::held::Scope;

/// A prompt as the engine will see it: what `kv_aware` looks up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPrompt {
    /// Keys of its full engine blocks (`kvgate_routing::held::token_keys`).
    pub keys: std::sync::Arc<[u64]>,
    /// Tokens the tokenizer produced (at most the blocks the index can match).
    pub tokens: usize,
    /// The prompt went on past what was tokenized.
    pub truncated: bool,
    /// The first block's scope-blind key and the prompt's scope (salt,
    /// partition), when not the default: how an event that does not say whose
    /// its first block is gets attributed to this request's tenant and partition.
    pub scoped_root: Option<(u64, Scope)>,
}

/// Tokenize as the engine will, as far as the index can match: `max_tokens`,
/// the reach of the approximate chain (`max_prompt_blocks` × `block_chars` ÷ 4,
/// 65,536 tokens at the defaults), so both see as far into a long prompt. A prompt that
/// cannot be tokenized (no chat template, a template that rejects it) is
/// routed by the approximate index instead: never an error for the client.
pub fn kv_prompt(
    kv: &crate::config::kv_aware::KvAwareConfig,
    max_tokens: usize,
    api: Api,
    body: &Value,
    scope: Scope,
) -> Option<KvPrompt> {
    let limit = max_tokens;
    let max_blocks = max_tokens / kv.block_size.max(1);
    let tok = &kv.tokenizer;
    let tokens = match api {
        Api::Chat => tok.chat(body, limit),
        Api::Messages => match crate::anthropic::chat::as_chat(body, tok.requires_system_first()) {
            Some(chat) => tok.chat(&chat, limit),
            None => Err(kvgate_tokenize::TokenizeError::BadMessages(
                "a Messages conversation kvgate does not mirror".into(),
            )),
        },
        Api::Completions => tok.completion(body.get("prompt")?, limit),
        Api::Native => {
            if body.get("messages").is_some() {
                tok.chat(body, limit)
            } else if let Some(p) = body.get("prompt") {
                tok.completion(p, limit)
            } else {
                let text = body.get("inputs")?.as_str()?;
                let mut ids = tok.encode(text, true);
                let truncated = ids.len() > limit;
                ids.truncate(limit);
                Ok(kvgate_tokenize::Tokens { ids, truncated })
            }
        }
    };
    let tokens = match tokens {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "prompt not tokenized; approximate index");
            crate::telemetry::kv_untokenized();
            return None;
        }
    };
    let ids = &tokens.ids;
    let keys = kvgate_routing::held::token_keys(scope.seed(), ids, kv.block_size, max_blocks);
    let scoped_root = (!scope.is_default() && ids.len() >= kv.block_size).then(|| {
        let root = kvgate_routing::held::root_content_key(&ids[..kv.block_size]);
        (root, scope)
    });
    Some(KvPrompt {
        keys: keys.into(),
        tokens: ids.len(),
        truncated: tokens.truncated,
        scoped_root,
    })
}
