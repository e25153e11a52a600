//! A prompt's routing figures: its window (the canonical text the key is
//! taken from, and the longer stretch the block chain is cut from), its
//! estimated tokens, its block chain for the approximate index, its engine
//! tokens and block keys under `kv_aware`, and the routing key itself.

use std::sync::Arc;

use kvgate_prefix::Api;
use kvgate_routing::Home;
use serde_json::Value;

use super::RouteInput;
use crate::error::ApiError;
use crate::route::{Placement, Route};
use crate::tenancy::settings::Secret;

/// Key `input` by its prompt (read from `value`), for `tenant`; the window
/// the key was taken from, for `explain`. `salt_secret` is the isolation
/// salting secret, when on: the engine then sees the tenant's salt.
pub fn key(
    input: &mut RouteInput,
    value: &Value,
    (tenant, salt_secret): (&str, Option<&Secret>),
    session: Option<&str>,
) -> Result<Vec<u8>, ApiError> {
    let (route, api) = (input.route, input.api);
    let routing = &input.endpoint.config.routing;
    let prompt = super::input::prompt_of(route, value)?;
    // One extraction serves both the key's window and, for cache-aware
    // strategies, the longer stretch the block chain is cut from.
    let scan = routing.scan_chars();
    let Scanned {
        text: mut window,
        history_from,
        named_by,
        opening_bytes,
        asked_from,
    } = window(route, &prompt, value, &routing.prompt_members, scan)?;
    // A scan that stopped short saw the whole prompt; one that filled up did
    // not, and the body's size is the better estimate of the rest.
    let seen = window.len();
    let prompt_chars = if seen < scan {
        seen
    } else {
        seen.max(input.body.len())
    };
    let density = &input.endpoint.density;
    let estimate = density.tokens_of(prompt_chars);
    input.prompt_chars = (seen < scan).then_some(prompt_chars as u64);
    input.opening_tokens = history_from.map(|chars| density.tokens_of(chars));
    // Embeddings are keyed (for `explain` and load strategies that use it)
    // but not indexed: no generation's cache is reused by a later request.
    if route.uses_strategy() && routing.strategy.uses_index() {
        input.chain = chain(input, value, tenant, salt_secret.is_some(), &window).into();
    }
    let kv = routing
        .kv
        .as_ref()
        .filter(|_| route.uses_strategy() && routing.strategy.uses_events())
        .and_then(|kv| {
            let scope = kvgate_routing::held::Scope {
                salt: engine_salt(salt_secret, value, tenant),
                partition: input.partition.clone(),
            };
            let reach = routing
                .max_prompt_blocks
                .saturating_mul(density.block_tokens(routing.block_chars) as usize);
            super::kv_prompt::kv_prompt(kv, reach, api, &prompt, scope)
        })
        .map(Arc::new);
    input.prompt_tokens = match &kv {
        Some(p) if !p.truncated => p.tokens as u64,
        Some(p) => estimate.max(p.tokens as u64),
        None => estimate,
    };
    input.kv = kv;
    // A chat conversation that nothing else names is named by its opening
    // and first question, on its early turns: while its own history is
    // shorter than the opening it shares (both in bytes: `prompt_chars`
    // counts bytes of the window, or of the body past it), and only for a
    // next question — a body ending with an answer is the client prefilling
    // it, not a conversation going on (`kvgate_routing::LongestPrefix`).
    let named = (session.is_none()
        && input.partition.is_empty()
        && routing.strategy.uses_index()
        && asks(&prompt))
    .then_some(named_by.zip(opening_bytes))
    .flatten()
    .filter(|&(_, opening)| prompt_chars.saturating_sub(opening) < opening)
    .and_then(|(end, _)| window.get(..end))
    .map(|name| Home::Named(kvgate_prefix::routing_key(tenant, "\u{1}", name)));
    window.truncate(key_window_len(api, &window, routing.prefix_length));
    let partition = &input.partition;
    input.key = match session {
        // A session hint keys the session, not its prompt, so that its first
        // turns, whose window still grows, stay together. U+0001 cannot occur
        // in a partition, so no partition's key equals a session's.
        Some(s) => kvgate_prefix::routing_key(tenant, &format!("{partition}\u{1}{s}"), b""),
        None => kvgate_prefix::routing_key(tenant, partition, &window),
    };
    // A session's first turn, hinted or under its own `prompt_cache_key`
    // (a partition), starts where the fewest sessions started lately: a
    // question (not a prefilled answer) in a conversation with no history
    // yet, placed by the strategy (not pinned to a response it names). A
    // hinted session's later turn that the cost model moves does the same.
    let indexed = route.uses_strategy() && routing.strategy.uses_index();
    let placed =
        matches!(api, Api::Chat | Api::Messages) && indexed && input.placement == Placement::Policy;
    let first_turn = placed && history_from.is_none() && asks(&prompt);
    input.home = match session {
        Some(_) if first_turn => Some(Home::Hinted),
        Some(_) => (placed && history_from.is_some()).then_some(Home::Lives),
        None if !partition.is_empty() => first_turn.then_some(Home::Keyed),
        // An unnamed first question, with its opening's estimated tokens
        // (all of the window's when the scan ends before its question).
        None => named
            .or(first_turn
                .then(|| Home::First(density.tokens_of(asked_from.unwrap_or(prompt_chars))))),
    };
    // Counted where it is served (`upstream::forward`), so that the next
    // session's first turn sees it. An unnamed first question counts too:
    // a conversation or a one-shot question, either lives where it starts.
    input.starts_session = first_turn && input.home.is_some();
    input.hinted = session.is_some() && indexed;
    Ok(window)
}

/// Whether a chat or Messages prompt ends with a user turn (a question or a
/// tool's result), not with an answer the client prefills.
fn asks(prompt: &Value) -> bool {
    prompt
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        .is_some_and(|role| role != "assistant")
}

/// A prompt's window, and where a conversation's parts lie in it (chat and
/// Messages only; `kvgate_prefix::Window`).
struct Scanned {
    text: Vec<u8>,
    /// The character where a conversation's own history begins.
    history_from: Option<usize>,
    /// The byte before its first answer.
    named_by: Option<usize>,
    /// The byte where its own history begins.
    opening_bytes: Option<usize>,
    /// The character where its first question begins, answered or not.
    asked_from: Option<usize>,
}

impl Scanned {
    fn text(text: Vec<u8>) -> Self {
        Self {
            text,
            history_from: None,
            named_by: None,
            opening_bytes: None,
            asked_from: None,
        }
    }
}

/// The canonical prompt text of up to `scan` characters, as the route's API
/// reads it.
fn window(
    route: Route,
    prompt: &Value,
    body: &Value,
    members: &[String],
    scan: usize,
) -> Result<Scanned, ApiError> {
    let conversation = |w: kvgate_prefix::Window| Scanned {
        text: w.text.into_bytes(),
        history_from: w.history_from,
        named_by: w.named_by,
        opening_bytes: w.opening_bytes,
        asked_from: w.asked_from,
    };
    Ok(match route.api() {
        Api::Chat => kvgate_prefix::chat_window_with_history(prompt, scan)
            .map(conversation)
            .map_err(|e| ApiError::invalid(&e.param, e.message))?,
        Api::Messages => kvgate_prefix::messages_window_with_history(prompt, scan)
            .map(conversation)
            .map_err(|e| ApiError::invalid(&e.param, e.message))?,
        Api::Completions => Scanned::text(
            kvgate_prefix::completions_window(prompt, scan)
                .map_err(|e| {
                    // Embeddings' `input` is read as completions' `prompt`.
                    let param = match route {
                        Route::Embeddings => e.param.replacen("prompt", "input", 1),
                        _ => e.param,
                    };
                    ApiError::invalid(&param, e.message)
                })?
                .into_bytes(),
        ),
        Api::Native => Scanned::text(kvgate_prefix::native_window(body, members, scan)),
    })
}

/// The prompt's block chain, salted by tenant and scoped as vLLM scopes its
/// blocks: by model (LoRA adapters too) and `cache_salt` as well as by
/// tokens, so two requests share cache only when both match. The client's
/// salt counts where it reaches the engine: the gateway replaces it when
/// isolation salting is on (`salted`).
fn chain(input: &RouteInput, value: &Value, tenant: &str, salted: bool, window: &[u8]) -> Vec<u64> {
    let routing = &input.endpoint.config.routing;
    let salt = (!salted)
        .then(|| value.get("cache_salt").and_then(Value::as_str))
        .flatten()
        .unwrap_or("");
    let model = input.model.as_deref().unwrap_or("");
    let scope = format!("{}\u{0}{model}\u{0}{salt}", input.partition);
    kvgate_prefix::block_chain(
        tenant,
        &scope,
        window,
        routing.block_chars,
        routing.max_prompt_blocks,
    )
}

/// The `cache_salt` the engine will see: the tenant's when isolation salting
/// is on (the admission step sets it), else the client's own.
pub fn engine_salt(salt_secret: Option<&Secret>, body: &Value, tenant: &str) -> Option<String> {
    match salt_secret {
        Some(secret) => Some(crate::tenancy::salt::for_tenant(secret, tenant)),
        None => body
            .get("cache_salt")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    }
}

/// Bytes of `window` that make the key's window: its first `prefix_length`
/// characters (OpenAI routes) or bytes (native routes, whose window is bytes of
/// canonical JSON), exactly what the window functions return for that limit.
pub fn key_window_len(api: Api, window: &[u8], prefix_length: usize) -> usize {
    if api == Api::Native || window.len() <= prefix_length {
        return window.len().min(prefix_length);
    }
    // Characters start at every byte that is not a UTF-8 continuation byte.
    window
        .iter()
        .enumerate()
        .filter(|(_, b)| **b & 0xC0 != 0x80)
        .nth(prefix_length)
        .map_or(window.len(), |(at, _)| at)
}
