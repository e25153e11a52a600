//! The decision list and a decision's explain view. A decision keeps what
//! the policy was asked (key, estimated prompt tokens) and the loads it saw,
//! so its view replays the endpoint's policy on exactly those inputs: the
//! same costs and order `POST /admin/explain` computes from a body, and
//! the same sentences ([`crate::request::explain::why`]). No prompt is
//! kept, so none is shown: sizes and the key's hash only.

use std::sync::Arc;

use kvgate_routing::{Load, Reason};
use serde_json::{Value, json};

use crate::fleet::{Endpoint, Runtime};
use crate::telemetry::live::Decision;

const REASONS: [Reason; 8] = [
    Reason::Affinity,
    Reason::Overflow,
    Reason::Fallback,
    Reason::Balance,
    Reason::LastResort,
    Reason::CacheHit,
    Reason::CacheSpread,
    Reason::Cold,
];

fn reason_of(s: &str) -> Option<Reason> {
    REASONS.into_iter().find(|r| r.as_str() == s)
}

/// The endpoint a decision was made on, while its instances are the same
/// number (a reload that changed them makes the loads mean nothing).
fn endpoint_of<'a>(rt: &'a Runtime, d: &Decision) -> Option<&'a Arc<Endpoint>> {
    rt.endpoint(&d.endpoint)
        .filter(|e| e.instances.len() == d.loads.len())
}

/// One line of the list.
pub fn line(rt: &Runtime, d: &Decision) -> Value {
    let costs = endpoint_of(rt, d).and_then(|e| e.policy.costs(&d.request, &d.loads));
    let matched_tokens = match (&costs, d.index) {
        (Some(c), Some(i)) => c.get(i).map(|c| c.cached_tokens),
        _ => None,
    };
    let ms = |t: Option<std::time::Duration>| t.map(|t| (t.as_secs_f64() * 1e4).round() / 10.0);
    json!({
        "seq": d.seq,
        "at_ms": d.at_ms,
        "tenant": &*d.tenant,
        "api": d.api,
        "endpoint": d.endpoint,
        "strategy": d.strategy,
        "instance": d.instance,
        "reason": d.reason,
        "attempts": d.attempts,
        "stream": d.stream,
        "body_bytes": d.body_bytes,
        "key": format!("{:016x}", d.request.key),
        "prompt_tokens_estimate": d.request.prompt_tokens,
        "matched_blocks": d.matched_blocks,
        "matched_tokens": matched_tokens,
        "cached_tokens": d.reported().map(|(_, c)| c),
        "prompt_tokens": d.reported().map(|(p, _)| p),
        "ttft_ms": ms(d.ttft()),
        "duration_ms": ms(d.duration()),
        "status": d.status(),
    })
}

/// The explain view of decision `d`: per instance what it held and what
/// it would have cost, the winner and why.
pub fn explain(rt: &Runtime, d: &Decision) -> Value {
    let mut v = line(rt, d);
    let Some(ep) = endpoint_of(rt, d) else {
        v["explain"] = json!({"note": "the endpoint's instances changed since (a reload): the loads no longer name them"});
        return v;
    };
    let costs = ep.policy.costs(&d.request, &d.loads);
    let plan = ep.policy.plan(&d.request, &d.loads);
    let idle: Vec<Load> = d
        .loads
        .iter()
        .map(|l| Load {
            matched_blocks: l.matched_blocks,
            ..Load::with_in_flight(0)
        })
        .collect();
    let preference = ep.policy.plan(&d.request, &idle);
    let name = |i: &usize| ep.instances.get(*i).map(|x| x.id.as_str());
    let instances: Vec<Value> = ep
        .instances
        .iter()
        .zip(&d.loads)
        .enumerate()
        .map(|(n, (i, l))| {
            let mut row = json!({
                "id": i.id,
                "winner": d.index == Some(n),
                "in_flight": l.in_flight,
                "available": l.available,
                "queued_prefill_tokens": l.queued_prefill,
                "waiting": l.waiting,
                "matched_blocks": l.matched_blocks,
                "prefilling": l.prefilling,
                "cache_full": l.cache_full(),
                "cache_fill": f64::from(l.cache_fill) / 1000.0,
            });
            if let Some(c) = costs.as_ref().and_then(|c| c.get(n)) {
                row["cached_tokens_estimate"] = json!(c.cached_tokens);
                row["uncached_tokens"] = json!(c.uncached_tokens);
                row["queued_tokens"] = json!(c.queued_tokens);
                row["displaced_tokens"] = json!(c.displaced_tokens);
                row["duplicated_tokens"] = json!(c.duplicated_tokens);
                row["delayed_tokens"] = json!(c.delayed_tokens);
                row["cost"] = json!(c.total);
            }
            row
        })
        .collect();
    let strategy = ep.config.routing.strategy;
    let why = match (d.reason, reason_of(d.reason)) {
        ("failover", _) => {
            "the planned instance refused the connection or answered 502/503 before any byte reached the client: the next in the plan"
        }
        ("unavailable", _) => "no instance of the endpoint could take the request",
        (_, Some(r)) => crate::request::explain::why(r, strategy),
        (_, None) => "",
    };
    v["explain"] = json!({
        "chosen": d.instance,
        "why": why,
        "replayed_choice": plan.order.first().and_then(name),
        "replayed_reason": plan.reason.as_str(),
        "preference_order": preference.order.iter().filter_map(name).collect::<Vec<_>>(),
        "instances": instances,
    });
    v
}
