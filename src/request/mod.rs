//! From a request's path, headers and body bytes to a [`RouteInput`]: the API,
//! the endpoint that serves it, the partition and the routing key. Pure and
//! synchronous so that `kvgate explain` runs exactly what the gateway runs.

pub mod explain;
mod fields;
pub mod input;
pub mod kv_prompt;
mod prompt;

use std::sync::Arc;

use axum::http::{HeaderMap, header};
use bytes::Bytes;
use kvgate_prefix::{Api, JsonError};

use crate::error::{ApiError, ErrorKind};
use crate::fleet::{Endpoint, Runtime};
use crate::openai::response_id::IdScope;
use crate::route::{Placement, Route};

pub const PREFIX_AWARE_ID_HEADER: &str = "x-amzn-sagemaker-prefix-aware-id";

/// What the gateway needs to route a request; built once by the pipeline's
/// analysis step and carried by the request to the proxy.
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
    /// Characters of the canonical prompt, when the gateway saw it whole:
    /// what the answer's `usage.prompt_tokens` is set against to learn the
    /// engine's tokens a character (`kvgate_routing::units`).
    pub prompt_chars: Option<u64>,
    /// Estimated tokens of a conversation's opening, when the prompt goes on
    /// with its own history ([`kvgate_routing::Request::opening_tokens`]).
    pub opening_tokens: Option<u64>,
    /// How a session's start is placed ([`kvgate_routing::Request::home`]).
    pub home: Option<kvgate_routing::Home>,
    /// A session's first turn (hinted, keyed, or a chat or Messages first
    /// question placed by cache-aware strategies):
    /// counted where it is served, as a session started there, unless the
    /// session lives there already ([`kvgate_routing::Load::recent_sessions`]).
    pub starts_session: bool,
    /// A session hint keys the request (`key` is the session's): where it is
    /// served is remembered as the session's home (`fleet::session_homes`).
    pub hinted: bool,
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
            prompt_chars: None,
            opening_tokens: None,
            home: None,
            starts_session: false,
            hinted: false,
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
        let (mut loads, seen) = self.endpoint.view(&self.chain, kv);
        if self.hinted {
            let now = crate::fleet::instance::now_ms();
            if let Some(home) = self.endpoint.sessions.get(self.key, now) {
                let at = self
                    .endpoint
                    .instances
                    .iter()
                    .position(|i| Arc::ptr_eq(i, &home));
                if let Some(l) = at.and_then(|at| loads.get_mut(at)) {
                    l.hosts_session = true;
                }
            }
        }
        (loads, seen)
    }

    /// What a routing policy is told of this request.
    pub fn routing_request(&self) -> kvgate_routing::Request {
        let routing = &self.endpoint.config.routing;
        kvgate_routing::Request {
            key: self.key,
            prompt_tokens: self.prompt_tokens,
            // kv_aware matches engine blocks of real tokens: their size is known.
            block_tokens: if routing.strategy.uses_events() {
                0
            } else {
                self.endpoint.density.block_tokens(routing.block_chars)
            },
            opening_tokens: self.opening_tokens,
            home: self.home,
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

/// [`analyse`] for any route with a JSON body: the body's routing fields,
/// the placement, then (for routes that read a prompt) the prompt's window,
/// block chain, engine tokens and key.
pub fn analyse_route(
    runtime: &Runtime,
    route: Route,
    endpoint_name: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
    tenant: &str,
) -> Result<Analysis, ApiError> {
    check_content_type(headers)?;
    let partition_header = fields::header_partition(headers)?;
    let value = kvgate_prefix::parse_strict(&body).map_err(|e| json_error(&e))?;
    let f = fields::Fields::read(runtime, route, endpoint_name, &value)?;
    let ids = matches!(route, Route::Responses)
        .then(|| IdScope::new(runtime.config.tenancy.salt_secret.as_ref(), tenant));
    let (placement, body) = fields::placement(route, ids.as_ref(), &f.endpoint, &value, body)?;
    // The header is the operator's partition; it wins over the body's key.
    let partition = partition_header.or(f.partition).unwrap_or_default();
    let mut input = RouteInput {
        model: f.model,
        stream: f.stream,
        partition,
        ids,
        prompt_tokens: f.endpoint.density.tokens_of(body.len()),
        has_cache_salt: value.get("cache_salt").is_some(),
        is_object: value.is_object(),
        body,
        ..RouteInput::unkeyed(route, f.endpoint, placement)
    };
    let window = if route.reads_prompt() {
        let secret = runtime.config.tenancy.salt_secret.as_ref();
        prompt::key(&mut input, &value, (tenant, secret), f.session.as_deref())?
    } else {
        Vec::new()
    };
    Ok(Analysis {
        input,
        window,
        session: f.session,
    })
}

fn json_error(e: &JsonError) -> ApiError {
    ApiError::new(
        ErrorKind::InvalidJson,
        // The parser's message already says what and where.
        e.to_string(),
    )
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
            let n = prompt::key_window_len(Api::Chat, long.as_bytes(), limit);
            assert_eq!(&long.as_bytes()[..n], short.as_bytes(), "chat {limit}");
            let long = kvgate_prefix::completions_window(&completions, 100_000).unwrap_or_default();
            let short = kvgate_prefix::completions_window(&completions, limit).unwrap_or_default();
            let n = prompt::key_window_len(Api::Completions, long.as_bytes(), limit);
            assert_eq!(
                &long.as_bytes()[..n],
                short.as_bytes(),
                "completions {limit}"
            );
            let long = kvgate_prefix::native_window(&chat, &members, 100_000);
            let short = kvgate_prefix::native_window(&chat, &members, limit);
            let n = prompt::key_window_len(Api::Native, &long, limit);
            assert_eq!(&long[..n], &short[..], "native {limit}");
        }
    }
}
