//! The console's picture of the gateway now: every endpoint and instance
//! (health, load, cache held against capacity, hit rate over the last
//! minute, TTFT over 15 minutes, KV-event feed) and every tenant seen
//! (last minute against limits, in flight, fair queue, refusals). Built from
//! the atomics the request path already keeps (`telemetry::live`); the only
//! locks taken are the KV feed's and the fair queue's, once per sample, not
//! once per viewer (see `events.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use serde_json::{Value, json};

use crate::fleet::{Endpoint, Instance, Runtime};
use crate::telemetry::live::ttft::Quantiles;

/// The fleet and the tenants, as one JSON value.
pub fn snapshot(rt: &Runtime) -> Value {
    json!({
        "at_ms": crate::telemetry::live::unix_ms(),
        "endpoints": rt.endpoints.iter().map(|e| endpoint(e)).collect::<Vec<_>>(),
        "tenants": tenants(rt),
    })
}

fn endpoint(ep: &Endpoint) -> Value {
    let queue = &ep.queue;
    json!({
        "name": ep.name(),
        "models": ep.config.models,
        "strategy": ep.config.routing.strategy.as_str(),
        "queue_waiting": queue.len(),
        "health_check_ms": ep.config.health.as_ref().map(|h| h.interval.as_millis() as u64),
        "instances": ep.instances.iter().zip(&ep.config.instances)
            .map(|(i, c)| instance(ep, i, c)).collect::<Vec<_>>(),
    })
}

fn quantiles(q: Option<Quantiles>) -> Value {
    q.map_or(
        Value::Null,
        |q| json!({"p50_ms": round(q.p50_ms), "p90_ms": round(q.p90_ms), "count": q.count}),
    )
}

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

fn instance(ep: &Endpoint, i: &Instance, c: &crate::config::InstanceConfig) -> Value {
    let live = &i.series.live;
    let [answers, prompt, cached] = live.minute.sum(60);
    let (series, all) = live.ttft.read();
    let health = if i.is_draining() {
        "draining"
    } else if i.is_warming() {
        "warming"
    } else if !i.is_healthy() {
        "unhealthy"
    } else if !i.available() {
        "cooling_down"
    } else {
        "healthy"
    };
    json!({
        "id": i.id,
        "url": i.url,
        "health": health,
        "healthy": i.is_healthy(),
        "in_flight": i.in_flight(),
        "queued_prefill_tokens": i.queued_prefill(),
        "cache": cache(ep, i, c),
        "hit_rate_1m": {
            "answers": answers,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "ratio": (prompt > 0).then(|| cached as f64 / prompt as f64),
        },
        "ttft_15m": quantiles(all),
        "ttft_by_minute": series.into_iter().map(quantiles).collect::<Vec<_>>(),
        "kv_events": kv_events(i),
    })
}

/// KV held against capacity, in tokens, and where the capacity comes from.
fn cache(ep: &Endpoint, i: &Instance, c: &crate::config::InstanceConfig) -> Value {
    let routing = &ep.config.routing;
    let (capacity, source) = match i.learned_cache_tokens() {
        Some(t) => (t, "learned"),
        None if !c.learn_cache_tokens || routing.cache_tokens_configured => {
            (c.cache_tokens, "configured")
        }
        None => (c.cache_tokens, "estimated"),
    };
    let (held, from) = match i.kv_feed() {
        Some(sub) => (sub.feed.held_blocks() * sub.feed.block_size, "kv_events"),
        None if routing.strategy.uses_index() => (
            i.index.len() * ep.index_block_tokens() as usize,
            "gateway_index",
        ),
        None => {
            return json!({"capacity_tokens": capacity, "capacity_source": source,
                "held_tokens": null, "held_source": "not_tracked"});
        }
    };
    json!({
        "capacity_tokens": capacity,
        "capacity_source": source,
        "held_tokens": held,
        "held_source": from,
    })
}

fn kv_events(i: &Instance) -> Value {
    let Some(sub) = i.kv_feed() else {
        return json!({"state": "not_configured"});
    };
    let c = &sub.feed.counters;
    let trust = sub.feed.trust(Instant::now());
    let age = match trust {
        crate::kv_events::Trust::Live { age } => age.map(|a| a.as_millis() as u64),
        _ => None,
    };
    json!({
        "state": trust.as_str(),
        "connected": !matches!(trust, crate::kv_events::Trust::Disconnected),
        "last_seq": c.next_seq.load(Relaxed).checked_sub(1),
        "last_batch_ms_ago": age,
        "batches": c.batches.load(Relaxed),
        "gaps": c.gaps.load(Relaxed),
        "replays": c.replays.load(Relaxed),
        "resets": c.resets.load(Relaxed),
        "dropped": c.dropped.load(Relaxed),
    })
}

fn tenants(rt: &Runtime) -> Vec<Value> {
    // Fair-queue service and waiting, summed over the endpoints' queues.
    let mut queued: HashMap<Arc<str>, (f64, usize)> = HashMap::new();
    for ep in &rt.endpoints {
        for (id, service, waiting) in ep.queue.tenants() {
            let e = queued.entry(id).or_default();
            e.0 += service;
            e.1 += waiting;
        }
    }
    rt.tenancy
        .tenants()
        .iter()
        .map(|t| {
            let [requests, tokens] = t.live.minute.sum(60);
            let (service, waiting) = queued.get(&t.id).copied().unwrap_or_default();
            let refusals: serde_json::Map<String, Value> = t
                .live
                .refusals()
                .map(|(why, n)| (why.to_owned(), json!(n)))
                .collect();
            json!({
                "id": &*t.id,
                "requests_1m": requests,
                "requests_per_minute": t.limits.requests_per_minute,
                "tokens_1m": tokens,
                "tokens_per_minute": t.limits.tokens_per_minute,
                "in_flight": t.in_flight(),
                "max_concurrency": t.limits.max_concurrency,
                "queue_service": service.round(),
                "queue_waiting": waiting,
                "refusals": refusals,
            })
        })
        .collect()
}
