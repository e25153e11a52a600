//! From a request's path, headers and body bytes to a [`RouteInput`]: the API,
//! the endpoint that serves it, the partition and the routing key. Pure and
//! synchronous so that `kvgate explain` runs exactly what the gateway runs.

pub mod explain;
pub mod input;
pub mod kv_prompt;

use std::sync::Arc;

use axum::http::{HeaderMap, header};
use bytes::Bytes;
use kvgate_prefix::{Api, JsonError};
use serde_json::Value;

use crate::error::{ApiError, ErrorKind};
use crate::fleet::{Endpoint, Runtime};
use crate::openai::response_id::IdScope;
use crate::route::{Placement, Route};

pub const PREFIX_AWARE_ID_HEADER: &str = "x-amzn-sagemaker-prefix-aware-id";

/// What the handler needs to route a request; built once by the
/// canonicalise layer and handed over in request extensions.
#[derive(Debug, Clone)]
pub struct RouteInput {
    /// How the prompt was windowed (see [`Route::api`]).
    pub api: Api,
    /// The route called: its metric label and upstream path.
    pub route: Route,
    /// How the instance is chosen.
    pub placement: Placement,
    /// Responses routes: whose response ids the answer's are rewritten to.
    pub ids: Option<IdScope>,
    /// The body is a streamed upload the handler forwards (`body` is empty).
    pub upload: bool,
    pub endpoint: Arc<Endpoint>,
    pub model: Option<String>,
    pub stream: bool,
    pub partition: String,
    pub key: u64,
    /// The prompt's block chain, salted by tenant and partition (cache-aware
    /// strategies only; empty otherwise).
    pub chain: Arc<[u64]>,
    /// The prompt's engine-block keys from its real tokens (`kv_aware`; `None`
    /// when the strategy is another or the prompt could not be tokenized).
    pub kv: Option<Arc<crate::request::kv_prompt::KvPrompt>>,
    /// Estimated prompt tokens (characters of canonical prompt ÷ 4), or the
    /// tokenizer's count under `kv_aware`.
    pub prompt_tokens: u64,
    /// The bytes to forward: the client's, untouched, except that the
    /// admission layer may set the upstream `cache_salt` (see `tenancy::salt`).
    pub body: Bytes,
    /// The body has a top-level `cache_salt` of its own (to be replaced).
    pub has_cache_salt: bool,
    /// The body is a JSON object (native bodies need not be).
    pub is_object: bool,
    /// Set by the admission layer; held by the response body until it ends,
    /// which frees the tenant's concurrency slot and settles its tokens.
    pub admission: Option<Arc<crate::tenancy::Admission>>,
}

impl RouteInput {
    /// A request placed without a prompt key (by-id routes, uploads, routes
    /// that read no prompt): nothing to index, no body of its own yet.
    pub fn unkeyed(route: Route, endpoint: Arc<Endpoint>, placement: Placement) -> Self {
        Self {
            api: route.api(),
            route,
            placement,
            ids: None,
            upload: false,
            endpoint,
            model: None,
            stream: false,
            partition: String::new(),
            key: 0,
            chain: Arc::new([]),
            kv: None,
            prompt_tokens: 0,
            body: Bytes::new(),
            has_cache_salt: false,
            is_object: false,
            admission: None,
        }
    }

    /// Every instance of its endpoint as the policy sees them for this
    /// request: loads with matched blocks, and where those came from.
    pub fn view(&self) -> (Vec<kvgate_routing::Load>, Vec<crate::fleet::Seen>) {
        let kv = self.kv.as_ref().map(|p| &p.keys[..]);
        self.endpoint.view(&self.chain, kv)
    }

    /// What a routing policy is told of this request.
    pub fn routing_request(&self) -> kvgate_routing::Request {
        kvgate_routing::Request {
            key: self.key,
            prompt_tokens: self.prompt_tokens,
        }
    }
}

/// A [`RouteInput`] plus the window it was keyed on (for `explain`).
#[derive(Debug)]
pub struct Analysis {
    pub input: RouteInput,
    pub window: Vec<u8>,
    /// The session hint the key was taken from instead of the window.
    pub session: Option<String>,
}

impl Route {
    /// The route of an [`Api`] (the routes `kvgate explain` and the benches know).
    pub fn from_api(api: Api) -> Self {
        match api {
            Api::Chat => Route::Chat,
            Api::Completions => Route::Completions,
            Api::Messages => Route::Messages,
            Api::Native => Route::Native,
        }
    }
}

pub fn api_label(api: Api) -> &'static str {
    match api {
        Api::Chat => "chat",
        Api::Completions => "completions",
        Api::Messages => "messages",
        Api::Native => "native",
    }
}

/// Reject bodies that say they are not JSON. A missing content type is
/// accepted: curl's `-d` and some SDKs omit it, and the body is parsed as JSON anyway.
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ok = ct.to_str().ok().is_some_and(|s| {
        let mime = s
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            "request bodies must be JSON: send Content-Type: application/json",
        )
        .with_param("content-type"))
    }
}

fn json_error(e: &JsonError) -> ApiError {
    ApiError::new(
        ErrorKind::InvalidJson,
        // The parser's message already says what and where.
        e.to_string(),
    )
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::InvalidRequest, message).with_param(param)
}

/// The partition from the prefix-aware-id header, validated.
fn header_partition(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut all = headers.get_all(PREFIX_AWARE_ID_HEADER).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        // "First one wins" would route by one and forward both.
        return Err(invalid(
            PREFIX_AWARE_ID_HEADER,
            "X-Amzn-SageMaker-Prefix-Aware-Id must be sent once",
        ));
    }
    let s = v.to_str().ok().filter(|s| kvgate_prefix::is_valid_partition_id(s)).ok_or_else(|| {
        invalid(
            PREFIX_AWARE_ID_HEADER,
            "X-Amzn-SageMaker-Prefix-Aware-Id must be 1-64 printable characters, the first not a space",
        )
    })?;
    Ok(Some(s.to_owned()))
}

/// Bytes of `window` that make the key's window: its first `prefix_length`
/// characters (OpenAI routes) or bytes (native routes, whose window is bytes of
/// canonical JSON), exactly what the window functions return for that limit.
fn key_window_len(api: Api, window: &[u8], prefix_length: usize) -> usize {
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

/// Parse, validate and key a request. `tenant` comes from authentication.
pub fn analyse(
    runtime: &Runtime,
    api: Api,
    endpoint_name: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
    tenant: &str,
) -> Result<Analysis, ApiError> {
    analyse_route(
        runtime,
        Route::from_api(api),
        endpoint_name,
        headers,
        body,
        tenant,
    )
}

/// [`analyse`] for any route with a JSON body.
pub fn analyse_route(
    runtime: &Runtime,
    route: Route,
    endpoint_name: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
    tenant: &str,
) -> Result<Analysis, ApiError> {
    let api = route.api();
    check_content_type(headers)?;
    let partition_header = header_partition(headers)?;
    let value = kvgate_prefix::parse_strict(&body).map_err(|e| json_error(&e))?;
    let (endpoint, model, stream, partition_body, session) = match api {
        Api::Native => {
            let name = endpoint_name.unwrap_or_default();
            let ep = runtime.endpoint(name).ok_or_else(|| {
                ApiError::new(
                    ErrorKind::EndpointNotFound,
                    format!("endpoint {name:?} does not exist"),
                )
            })?;
            let model = value
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let stream = value
                .get("stream")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            (Arc::clone(ep), model, stream, None, None)
        }
        Api::Chat | Api::Completions | Api::Messages => {
            let obj = value
                .as_object()
                .ok_or_else(|| invalid("body", "the request body must be a JSON object"))?;
            let model = match obj.get("model") {
                Some(Value::String(m)) => m.clone(),
                Some(_) => return Err(invalid("model", "`model` must be a string")),
                None => return Err(invalid("model", "`model` is required")),
            };
            let ep = runtime.endpoint_for_model(&model).ok_or_else(|| {
                ApiError::new(
                    ErrorKind::ModelNotFound,
                    format!("the model `{model}` does not exist or you do not have access to it"),
                )
                .with_param("model")
            })?;
            let stream = match obj.get("stream") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(invalid("stream", "`stream` must be a boolean")),
            };
            if route == Route::Messages {
                crate::anthropic::request::check_max_tokens(obj)?;
            }
            let session = match api {
                Api::Messages => crate::anthropic::request::session(obj)?,
                _ => None,
            };
            let pck = match obj.get("prompt_cache_key") {
                _ if api == Api::Messages => None,
                None | Some(Value::Null) => None,
                // Control characters (NUL above all) could blur the key's
                // field boundaries; no legitimate user or session id has them.
                Some(Value::String(s)) if !s.chars().any(char::is_control) => Some(s.clone()),
                Some(_) => {
                    return Err(invalid(
                        "prompt_cache_key",
                        "`prompt_cache_key` must be a string without control characters",
                    ));
                }
            };
            (Arc::clone(ep), Some(model), stream, pck, session)
        }
    };
    let routing = &endpoint.config.routing;
    let ids = matches!(route, Route::Responses)
        .then(|| IdScope::new(runtime.config.tenancy.salt_secret.as_ref(), tenant));
    let mut placement = if route.uses_strategy() {
        Placement::Policy
    } else {
        Placement::Load
    };
    let mut body = body;
    if let (Some(scope), Some(prev)) = (
        &ids,
        value.get("previous_response_id").filter(|v| !v.is_null()),
    ) {
        let (pinned, upstream_body) =
            crate::request::input::previous_response(scope, &endpoint, prev, &body)?;
        placement = Placement::Pinned(pinned);
        body = upstream_body;
    }
    if !route.reads_prompt() {
        return Ok(Analysis {
            input: RouteInput {
                ids,
                model,
                stream,
                partition: partition_header.or(partition_body).unwrap_or_default(),
                prompt_tokens: kvgate_routing::cost::tokens_of_chars(body.len()),
                has_cache_salt: value.get("cache_salt").is_some(),
                is_object: value.is_object(),
                body,
                ..RouteInput::unkeyed(route, endpoint, placement)
            },
            window: Vec::new(),
            session,
        });
    }
    let prompt = crate::request::input::prompt_of(route, &value)?;
    // Embeddings are keyed (for `explain` and load strategies that use it) but
    // not indexed: there is no generation whose cache a later request reuses.
    let indexed = route.uses_strategy() && routing.strategy.uses_index();
    // One extraction serves both the key's window and, for cache-aware
    // strategies, the longer stretch the block chain is cut from.
    let scan = routing.scan_chars();
    let value_ref: &Value = &prompt;
    let mut window = match api {
        Api::Chat => kvgate_prefix::chat_window(value_ref, scan)
            .map_err(|e| invalid(&e.param, e.message))?
            .into_bytes(),
        Api::Messages => kvgate_prefix::messages_window(value_ref, scan)
            .map_err(|e| invalid(&e.param, e.message))?
            .into_bytes(),
        Api::Completions => kvgate_prefix::completions_window(value_ref, scan)
            .map_err(|e| {
                // Embeddings' `input` is read as completions' `prompt`.
                let param = match route {
                    Route::Embeddings => e.param.replacen("prompt", "input", 1),
                    _ => e.param,
                };
                invalid(&param, e.message)
            })?
            .into_bytes(),
        Api::Native => kvgate_prefix::native_window(&value, &routing.prompt_members, scan),
    };
    // The header is the operator's partition; it wins over the body's key.
    let partition = partition_header.or(partition_body).unwrap_or_default();
    // A scan that stopped short saw the whole prompt; one that filled up did not,
    // and the body's size is the better estimate of the rest.
    let seen = window.len();
    let prompt_chars = if seen < scan {
        seen
    } else {
        seen.max(body.len())
    };
    let prompt_tokens = kvgate_routing::cost::tokens_of_chars(prompt_chars);
    let chain: Arc<[u64]> = if indexed {
        // vLLM keys its blocks by model (LoRA adapters too) and cache_salt as
        // well as by tokens: two requests share cache only when both match.
        // The client's salt counts where it reaches the engine: the gateway
        // replaces it when isolation salting is on.
        let replaced = runtime.config.tenancy.salt_secret.is_some();
        let salt = (!replaced)
            .then(|| value.get("cache_salt").and_then(Value::as_str))
            .flatten()
            .unwrap_or("");
        let scope = format!(
            "{partition}\u{0}{}\u{0}{salt}",
            model.as_deref().unwrap_or("")
        );
        kvgate_prefix::block_chain(
            tenant,
            &scope,
            &window,
            routing.block_chars,
            routing.max_prompt_blocks,
        )
        .into()
    } else {
        Arc::new([])
    };
    let kv = routing
        .kv
        .as_ref()
        .filter(|_| route.uses_strategy() && routing.strategy.uses_events())
        .and_then(|kv| {
            let scope = kvgate_routing::held::Scope {
                salt: crate::request::kv_prompt::engine_salt(runtime, &value, tenant),
                partition: partition.clone(),
            };
            let reach = routing
                .max_prompt_blocks
                .saturating_mul(kvgate_routing::cost::block_tokens(routing.block_chars));
            crate::request::kv_prompt::kv_prompt(kv, reach, api, value_ref, scope)
        })
        .map(Arc::new);
    let prompt_tokens = match &kv {
        Some(p) if !p.truncated => p.tokens as u64,
        Some(p) => prompt_tokens.max(p.tokens as u64),
        None => prompt_tokens,
    };
    let key_len = key_window_len(api, &window, routing.prefix_length);
    window.truncate(key_len);
    let key = match &session {
        // A session hint keys the session, not its prompt, so that its first
        // turns, whose window still grows, stay together. U+0001 cannot occur
        // in a partition, so no partition's key equals a session's.
        Some(s) => kvgate_prefix::routing_key(tenant, &format!("{partition}\u{1}{s}"), b""),
        None => kvgate_prefix::routing_key(tenant, &partition, &window),
    };
    let has_cache_salt = value.get("cache_salt").is_some();
    Ok(Analysis {
        input: RouteInput {
            api,
            route,
            placement,
            ids,
            upload: false,
            endpoint,
            model,
            stream,
            partition,
            key,
            chain,
            kv,
            prompt_tokens,
            body,
            has_cache_salt,
            is_object: value.is_object(),
            admission: None,
        },
        window,
        session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key's window cut from a longer scan equals the window asked for directly,
    /// so `longest_prefix` and `prefix_aware` compute the same keys.
    #[test]
    fn key_window_from_a_longer_scan_is_the_window() {
        let text = "héllo wörld, ünïcode and ascii; ".repeat(200);
        let chat = serde_json::json!({"messages": [
            {"role": "system", "content": text},
            {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        ], "tools": [{"type": "function"}]});
        let completions = serde_json::json!({"prompt": text});
        let members = kvgate_prefix::default_prompt_members();
        for limit in [1, 1024, 4000, 6400, 7000] {
            let long = kvgate_prefix::chat_window(&chat, 100_000).unwrap_or_default();
            let short = kvgate_prefix::chat_window(&chat, limit).unwrap_or_default();
            let n = key_window_len(Api::Chat, long.as_bytes(), limit);
            assert_eq!(&long.as_bytes()[..n], short.as_bytes(), "chat {limit}");
            let long = kvgate_prefix::completions_window(&completions, 100_000).unwrap_or_default();
            let short = kvgate_prefix::completions_window(&completions, limit).unwrap_or_default();
            let n = key_window_len(Api::Completions, long.as_bytes(), limit);
            assert_eq!(
                &long.as_bytes()[..n],
                short.as_bytes(),
                "completions {limit}"
            );
            let long = kvgate_prefix::native_window(&chat, &members, 100_000);
            let short = kvgate_prefix::native_window(&chat, &members, limit);
            let n = key_window_len(Api::Native, &long, limit);
            assert_eq!(&long[..n], &short[..], "native {limit}");
        }
    }
}
