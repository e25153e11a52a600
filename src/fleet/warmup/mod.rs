//! Warm-up on scale-out: an instance that joins an endpoint (a reload adds it;
//! discovery will too) is sent the endpoint's hottest prefixes, one
//! `max_tokens: 1` request each, before it takes its share. Until then it is
//! unavailable to routing (tried last, like an instance cooling down), so the
//! first real requests for those prefixes find them cached — with `kv_aware`
//! the instance's own events say so; otherwise its index is filled as it is
//! for any request sent there. Bounded by `warmup.timeout_ms`: an instance
//! that cannot be warmed in time takes traffic cold rather than never.

pub mod hot;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde_json::Value;

use crate::config::kv_aware::WarmupConfig;
use crate::fleet::Instance;
use crate::telemetry;

pub use hot::HotPrefixes;

/// A body asking for one token of `body`'s prompt: the prefill is the point.
fn one_token(body: &Bytes) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    for k in [
        "stream",
        "stream_options",
        "max_completion_tokens",
        "n",
        "logprobs",
        "top_logprobs",
    ] {
        obj.remove(k);
    }
    obj.insert("max_tokens".into(), Value::from(1));
    if let Some(Value::Object(p)) = obj.get_mut("parameters") {
        p.insert("max_new_tokens".into(), Value::from(1));
    }
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// Warm `instance` with `hot`'s prefixes, then let it take traffic.
pub async fn warm(
    client: reqwest::Client,
    instance: Arc<Instance>,
    hot: Vec<hot::Hot>,
    cfg: WarmupConfig,
    authorization: Option<axum::http::HeaderValue>,
) {
    let started = Instant::now();
    let n = hot.len();
    let work = async {
        for h in &hot {
            let Some(body) = one_token(&h.body) else {
                continue;
            };
            let mut req = client
                .post(format!("{}{}", instance.url, h.path))
                .header("content-type", "application/json")
                .body(body);
            if let Some(a) = &authorization {
                req = req.header("authorization", a.clone());
            }
            let ok = match req.send().await {
                Ok(r) => {
                    let good = r.status().is_success();
                    // Read it through: the prefill is done once the answer is.
                    let _ = r.bytes().await;
                    good
                }
                Err(_) => false,
            };
            if ok && !h.chain.is_empty() {
                instance.index.insert(&h.chain);
            }
            telemetry::warmup(
                &instance.endpoint,
                &instance.id,
                if ok { "ok" } else { "error" },
            );
        }
    };
    if tokio::time::timeout(cfg.timeout, work).await.is_err() {
        telemetry::warmup(&instance.endpoint, &instance.id, "timeout");
        tracing::warn!(endpoint = %instance.endpoint, instance = %instance.id, "warm-up timed out; taking traffic anyway");
    }
    instance.set_warming(false);
    tracing::info!(endpoint = %instance.endpoint, instance = %instance.id, prefixes = n, took_ms = started.elapsed().as_millis() as u64, "instance warmed");
}
