//! "Why did this request go there?" — runs the same analysis and policy as a
//! live request and reports each step: the API, the canonical window (length
//! and excerpt, never the whole prompt), the partition, the key, the ring
//! order and the instance that would be chosen now, with the reason.
//! Served by `kvgate explain` and by the authenticated `/admin/explain/…` route.

use axum::http::HeaderMap;
use bytes::Bytes;
use kvgate_prefix::Api;
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorKind};
use crate::route_input::{analyse, api_label};
use crate::routing::Load;
use crate::state::Runtime;

const EXCERPT_CHARS: usize = 60;

/// Which API and endpoint a gateway path means.
pub fn api_for_path(path: &str) -> Option<(Api, Option<String>)> {
    let path = path.trim_end_matches('/');
    match path {
        "/v1/chat/completions" => Some((Api::Chat, None)),
        "/v1/completions" => Some((Api::Completions, None)),
        _ => {
            let rest = path.strip_prefix("/endpoints/")?;
            let (name, tail) = rest.split_once('/')?;
            matches!(tail, "invocations" | "invocations-response-stream")
                .then(|| (Api::Native, Some(name.to_owned())))
        }
    }
}

fn excerpt(window: &[u8]) -> (String, String) {
    let text = String::from_utf8_lossy(window);
    let chars: Vec<char> = text.chars().collect();
    let head: String = chars.iter().take(EXCERPT_CHARS).collect();
    let tail: String = chars[chars.len().saturating_sub(EXCERPT_CHARS)..]
        .iter()
        .collect();
    (head, tail)
}

/// Explain how `body`, sent to `path` with `headers` by `tenant`, would be routed now.
pub fn explain(
    runtime: &Runtime,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    tenant: &str,
) -> Result<Value, ApiError> {
    let (api, endpoint) = api_for_path(path).ok_or_else(|| {
        ApiError::new(
            ErrorKind::RouteNotFound,
            format!("{path} is not an inference route"),
        )
    })?;
    let analysis = analyse(runtime, api, endpoint.as_deref(), headers, body, tenant)?;
    let input = &analysis.input;
    let ep = &input.endpoint;
    let routing = &ep.config.routing;
    let ids: Vec<&str> = ep.instances.iter().map(|i| i.id.as_str()).collect();
    let idle: Vec<Load> = ep
        .instances
        .iter()
        .map(|_| Load {
            in_flight: 0,
            available: true,
        })
        .collect();
    let preference = ep.policy.plan(input.key, &idle);
    let loads: Vec<Load> = ep.instances.iter().map(|i| i.load()).collect();
    let now = ep.policy.plan(input.key, &loads);
    let unit = if api == Api::Native {
        "bytes"
    } else {
        "characters"
    };
    let length = if api == Api::Native {
        analysis.window.len()
    } else {
        String::from_utf8_lossy(&analysis.window).chars().count()
    };
    let (head, tail) = excerpt(&analysis.window);
    let mut notes = Vec::new();
    if length < routing.prefix_length {
        notes.push(match api {
            Api::Native => format!(
                "the whole canonical body ({length} bytes) fits in prefix_length {}: members other than the prompt (parameters, max_tokens…) are part of the key, so requests that share a prompt but differ in parameters route apart",
                routing.prefix_length
            ),
            _ => format!(
                "the whole prompt ({length} characters) fits in prefix_length {}: requests must match in full to share an instance",
                routing.prefix_length
            ),
        });
    }
    if input.partition.is_empty() {
        notes.push("no partition: set prompt_cache_key or X-Amzn-SageMaker-Prefix-Aware-Id to split one prefix's traffic by user or session".to_owned());
    }
    let name = |i: &usize| ids.get(*i).copied().unwrap_or("?");
    Ok(json!({
        "api": api_label(api),
        "endpoint": ep.name(),
        "model": input.model,
        "stream": input.stream,
        "tenant": tenant,
        "partition": input.partition,
        "window": {
            "unit": unit,
            "length": length,
            "prefix_length": routing.prefix_length,
            "starts_with": head,
            "ends_with": tail,
        },
        "key": format!("{:016x}", input.key),
        "strategy": routing.strategy.as_str(),
        "concurrency_threshold": routing.concurrency_threshold,
        "preference_order": preference.order.iter().map(name).collect::<Vec<_>>(),
        "instances": ep.instances.iter().map(|i| json!({"id": i.id, "in_flight": i.in_flight(), "available": i.available()})).collect::<Vec<_>>(),
        "chosen": now.order.first().map(name),
        "reason": now.reason.as_str(),
        "notes": notes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_apis() {
        assert_eq!(
            api_for_path("/v1/chat/completions"),
            Some((Api::Chat, None))
        );
        assert_eq!(
            api_for_path("/endpoints/a/invocations"),
            Some((Api::Native, Some("a".into())))
        );
        assert_eq!(api_for_path("/v1/models"), None);
        assert_eq!(api_for_path("/endpoints/a/other"), None);
    }
}
