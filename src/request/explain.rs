//! "Why did this request go there?" — runs the same analysis and policy as a
//! live request and reports each step: the API, the canonical window (length
//! and excerpt, never the whole prompt), the partition, the key, the ring
//! order and the instance that would be chosen now, with the reason.
//! Served by `kvgate explain` and by the admin-only `/admin/explain/…` route.
//! A tenant's model allow-list applies as it would to the request (403).

use axum::http::HeaderMap;
use bytes::Bytes;
use kvgate_prefix::Api;
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorKind};
use crate::fleet::Runtime;
use crate::fleet::{Endpoint, Seen};
use crate::request::analyse_route;
use crate::route::Route;
use kvgate_routing::{Cost, Load, Reason, Strategy};

const EXCERPT_CHARS: usize = 60;

/// Which API and endpoint a gateway path means.
pub fn api_for_path(path: &str) -> Option<(Api, Option<String>)> {
    route_for_path(path).map(|(route, ep)| (route.api(), ep))
}

/// The route of a gateway path whose prompt `explain` can analyse (SageMaker's
/// container `/invocations` names no endpoint and is not one of them).
fn route_for_path(path: &str) -> Option<(Route, Option<String>)> {
    Route::of_path("post", path)
        .filter(|(route, ep)| route.reads_prompt() && (*route != Route::Native || ep.is_some()))
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
    let (route, endpoint) = route_for_path(path).ok_or_else(|| {
        ApiError::new(
            ErrorKind::RouteNotFound,
            format!("{path} is not an inference route"),
        )
    })?;
    let api = route.api();
    let analysis = analyse_route(runtime, route, endpoint.as_deref(), headers, body, tenant)?;
    let input = &analysis.input;
    let ep = &input.endpoint;
    // The tenant's allow-list, as the live request would meet it (403).
    runtime
        .tenancy
        .check_models(tenant, api, input.model.as_deref(), &ep.config.models)?;
    let limits = runtime.tenancy.limits(tenant);
    let routing = &ep.config.routing;
    let ids: Vec<&str> = ep.instances.iter().map(|i| i.id.as_str()).collect();
    let request = input.routing_request();
    // The preference of an idle fleet holding what it holds now, and the choice now.
    let (loads, seen) = input.view();
    let idle: Vec<Load> = loads
        .iter()
        .map(|l| Load {
            matched_blocks: l.matched_blocks,
            ..Load::with_in_flight(0)
        })
        .collect();
    let preference = ep.policy.plan(&request, &idle);
    let now = ep.policy.plan(&request, &loads);
    let costs = ep.policy.costs(&request, &loads);
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
    if let Some(session) = &analysis.session {
        notes.push(format!("session hint {session:?} (metadata.user_id): the key is the session's, not the window's, so its turns stay together while the prompt grows"));
    } else if input.home == Some(kvgate_routing::Home::Keyed) {
        notes.push("a session's first turn under this partition (prompt_cache_key, or the prefix-aware-id header): if nothing under it is held yet, it starts on the instance where the fewest sessions started lately (recent_sessions) of those within one prompt of the cheapest, and its later turns follow what it left there".to_owned());
    } else if matches!(input.home, Some(kvgate_routing::Home::First(_))) {
        notes.push("a conversation's first question that nothing names: when no instance holds more of it than its opening (its tools and system prompt), of the instances within one engine step of the cheapest (the open instances' median learned per-request overhead) that hold within a step as much of its opening as any, the one where the fewest sessions started lately (recent_sessions, to half a session; then the cheapest), since a conversation stays where it starts; the cost model cannot tell instances that close apart".to_owned());
    } else if input.home.is_some() {
        notes.push("a conversation in its early turns (its history shorter than its opening), named by its opening and first question: it moves to that name's instance on the ring when the instance it would otherwise go to is busier and that one holds its opening or nothing, so conversations that share an opening spread; set prompt_cache_key to name it".to_owned());
    } else if input.partition.is_empty() {
        notes.push("no partition: set prompt_cache_key or X-Amzn-SageMaker-Prefix-Aware-Id to split one prefix's traffic by user or session".to_owned());
    }
    let queue = &runtime.config.queue;
    let would_wait = input.route.uses_strategy() && input.endpoint.queue.would_wait();
    if would_wait {
        notes.push(format!(
            "every instance is saturated (or others wait already): this request would wait in the gateway's fair queue, behind {} others, for up to {} ms",
            input.endpoint.queue.len(),
            queue.max_wait.as_millis()
        ));
    }
    let name = |i: &usize| ids.get(*i).copied().unwrap_or("?");
    Ok(json!({
        "api": route.label(),
        "endpoint": ep.name(),
        "model": input.model,
        "stream": input.stream,
        "tenant": tenant,
        "tenant_limits": {
            "max_concurrency": limits.max_concurrency,
            "requests_per_minute": limits.requests_per_minute,
            "tokens_per_minute": limits.tokens_per_minute,
            "models": limits.models.as_ref().map(|m| {
                let mut m: Vec<&String> = m.iter().collect();
                m.sort();
                m
            }),
        },
        "partition": input.partition,
        "session": analysis.session,
        "queue": {
            "enabled": queue.enabled,
            "would_wait": would_wait,
            "waiting": input.endpoint.queue.len(),
        },
        "window": {
            "unit": unit,
            "length": length,
            "prefix_length": routing.prefix_length,
            "starts_with": head,
            "ends_with": tail,
        },
        "key": format!("{:016x}", input.key),
        "prompt_tokens_estimate": input.prompt_tokens,
        // A continuation's opening: an instance holding more than this
        // holds the conversation's own history, where the balance cap does
        // not bind it (`longest_prefix`, `kv_aware`).
        "opening_tokens_estimate": input.opening_tokens,
        "units": units(ep),
        "chain_blocks": input.chain.len(),
        "prompt_tokens": input.kv.as_ref().map(|k| k.tokens),
        "engine_blocks": input.kv.as_ref().map(|k| k.keys.len()),
        "strategy": routing.strategy.as_str(),
        "concurrency_threshold": routing.concurrency_threshold,
        "preference_order": preference.order.iter().map(name).collect::<Vec<_>>(),
        "instances": instances_view(ep, &loads, &seen, costs.as_deref()),
        "chosen": now.order.first().map(name),
        "reason": now.reason.as_str(),
        "why": why(now.reason, routing.strategy),
        "notes": notes,
    }))
}

/// The engines' tokens a character the estimates use, and what it rests on.
fn units(ep: &Endpoint) -> Value {
    let u = ep.density.snapshot();
    json!({
        "tokens_per_char": (u.tokens_per_char * 1e4).round() / 1e4,
        "source": if u.learned { "learned from answers' usage" } else { "default (4 characters a token)" },
        "answers": u.answers,
        "refused": u.refused,
        "learned_after": kvgate_routing::units::MIN_ANSWERS,
    })
}

/// An instance's learned fixed cost of a request and prefill rate, and what
/// they rest on (`kvgate_routing::pace`).
fn pace(i: &crate::fleet::Instance) -> Value {
    use kvgate_routing::pace::Basis;
    let p = i.pace.snapshot();
    let round = |v: Option<f64>| v.map(|v| (v * 10.0).round() / 10.0);
    json!({
        "overhead_tokens": p.overhead_tokens,
        "running_weight_tokens": p.running_weight,
        "tokens_per_s": round(p.tokens_per_s),
        "step_ms": round(p.step_ms),
        "latency_ms": round(p.latency_ms),
        "source": match p.basis {
            Basis::Fit => "learned from streamed first tokens",
            Basis::FirstAnswers => "first answers (gap between tokens × prefill rate)",
            Basis::Guess => "default (256 tokens a request)",
        },
        "fit_stands": p.fit_stands,
        "answers": p.answers,
        "gaps": p.gaps,
        "refused": p.refused,
        "learned_after": kvgate_routing::pace::MIN_ANSWERS,
        "first_reading_after": kvgate_routing::pace::MIN_GAPS,
    })
}

/// Per instance: load, and for cost-weighing strategies what it holds and what it would cost.
fn instances_view(
    ep: &Endpoint,
    loads: &[Load],
    seen: &[Seen],
    costs: Option<&[Cost]>,
) -> Vec<Value> {
    let kv_aware = ep.config.routing.strategy.uses_events();
    ep.instances
        .iter()
        .zip(loads)
        .enumerate()
        .map(|(n, (i, l))| {
            let mut v = json!({"id": i.id, "in_flight": l.in_flight, "available": l.available});
            if let Some(c) = costs.and_then(|c| c.get(n)) {
                v["matched_blocks"] = json!(l.matched_blocks);
                v["cached_tokens_estimate"] = json!(c.cached_tokens);
                v["uncached_tokens"] = json!(c.uncached_tokens);
                v["queued_prefill_tokens"] = json!(l.queued_prefill);
                v["waiting"] = json!(l.waiting);
                // Its match is being prefilled there now: it joins that prefill.
                v["prefilling"] = json!(l.prefilling);
                v["queued_tokens"] = json!(c.queued_tokens);
                // A copy into a full cache evicts as much as it must prefill.
                v["cache_full"] = json!(l.cache_full());
                v["cache_fill"] = json!(f64::from(l.cache_fill) / 1000.0);
                v["displaced_tokens"] = json!(c.displaced_tokens);
                v["duplicated_tokens"] = json!(c.duplicated_tokens);
                // What its prefill would add to the waits of those waiting there.
                v["delayed_tokens"] = json!(c.delayed_tokens);
                v["recent_work_tokens"] = json!(l.recent_work);
                v["recent_sessions"] =
                    json!(l.recent_sessions as f64 / kvgate_routing::SESSION_UNIT as f64);
                v["hosts_session"] = json!(l.hosts_session);
                v["pace"] = pace(i);
                v["cost"] = json!(c.total);
                v["index_blocks"] = json!(i.index.len());
                v["index_capacity_blocks"] = json!(i.index.capacity());
            }
            if kv_aware && let Some(s) = seen.get(n) {
                v["source"] = json!(if s.from_events {
                    "events"
                } else {
                    "approximate"
                });
                let feed = i.kv_feed();
                v["kv_events"] = match (s.trust, feed) {
                    (Some(t), Some(sub)) => {
                        let age = match t {
                            crate::kv_events::Trust::Live { age } => {
                                age.map(|a| a.as_millis() as u64)
                            }
                            _ => None,
                        };
                        let c = &sub.feed.counters;
                        let n = |a: &std::sync::atomic::AtomicU64| {
                            a.load(std::sync::atomic::Ordering::Relaxed)
                        };
                        json!({
                            "state": t.as_str(),
                            "last_batch_ms_ago": age,
                            "held_blocks": sub.feed.held_blocks(),
                            "batches": n(&c.batches),
                            "applied": n(&c.applied),
                            "dropped": n(&c.dropped),
                            "gaps": n(&c.gaps),
                            "replays": n(&c.replays),
                            "resets": n(&c.resets),
                            "shed": n(&c.shed),
                        })
                    }
                    _ => json!({"state": "not_configured"}),
                };
                if s.from_events {
                    v["held_prefix_blocks"] = json!(s.held_blocks);
                    v["held_prefix_gpu_blocks"] = json!(s.gpu_blocks);
                }
            }
            v
        })
        .collect()
}

/// The reason in a sentence (also the console's decision view).
pub fn why(reason: Reason, strategy: Strategy) -> &'static str {
    match (reason, strategy) {
        (Reason::CacheHit, _) => {
            "least cost, and it holds the longest cached prefix of this prompt"
        }
        (Reason::CacheSpread, _) => {
            "least cost: an instance holding more of this prompt is at its limit (the balance cap binds it unless it holds this conversation past its opening), or has more prefill queued than recomputing the difference here costs (twice that when this cache is full, for what the copy evicts); a conversation moved off the instances holding its history goes, of the others within one engine step of the cheapest and cheaper than staying, where the fewest sessions started"
        }
        (Reason::Cold, _) => {
            "no instance holds any of this prompt: the least loaded, ties broken by the work given each instance lately, then the ring"
        }
        (Reason::Affinity, Strategy::LongestPrefix | Strategy::KvAware) => {
            "a session's start: a metadata.user_id or prompt_cache_key session's first turn where the fewest sessions started lately, a named chat conversation's early turn on its name's first instance on the ring under its limits, or an unnamed first question where the fewest sessions started lately among the instances within one engine step of the cheapest, so sessions spread as they start; its later turns go where their history is"
        }
        (Reason::Affinity, _) => "the key's first instance on the ring, under its limits",
        (Reason::Overflow, _) => {
            "the key's earlier ring instances are full: the next one under its limits"
        }
        (Reason::Fallback, Strategy::LongestPrefix | Strategy::KvAware) => {
            "every instance is at its limit (concurrency_threshold, or the balance cap + 1): the least costly"
        }
        (Reason::Fallback, _) => "every instance is full: the least loaded",
        (Reason::Balance, _) => "a strategy that ignores the prompt",
        (Reason::LastResort, _) => "no instance is available: trying them all anyway",
    }
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
