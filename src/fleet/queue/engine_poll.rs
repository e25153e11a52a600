//! Reading each instance's load from its engine (`/metrics`, see
//! `fleet::engine_load`) every `queue.engine_poll_ms` — for endpoints routed
//! by a cache-aware strategy, which weigh it, and for all while queueing is
//! on — and releasing waiting requests when an engine has room again.
//! Never on the request path. An engine whose `/metrics` is missing or
//! unreadable is routed on the gateway's own counts: counted, logged once.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;

use crate::fleet::AppState;
use crate::fleet::Instance;

/// A `/metrics` answer must come within this.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How often to look again while queueing is off.
const IDLE: Duration = Duration::from_secs(1);

/// Run until the state is dropped by everyone else.
pub async fn run(state: Weak<AppState>) {
    loop {
        let Some(live) = state.upgrade() else { return };
        let rt = live.runtime.load_full();
        drop(live);
        let (enabled, poll) = (rt.config.queue.enabled, rt.config.queue.engine_poll);
        let wanted =
            |ep: &&Arc<crate::fleet::Endpoint>| enabled || ep.config.routing.strategy.uses_index();
        if !rt.endpoints.iter().any(|ep| wanted(&ep)) {
            drop(rt);
            tokio::time::sleep(IDLE).await;
            continue;
        }
        let reads = rt.endpoints.iter().filter(wanted).flat_map(|ep| {
            ep.instances
                .iter()
                .map(|inst| read(rt.client.clone(), Arc::clone(inst)))
        });
        join_all(reads).await;
        if enabled {
            for ep in &rt.endpoints {
                ep.queue.pump();
            }
        }
        drop(rt);
        tokio::time::sleep(poll).await;
    }
}

async fn read(client: reqwest::Client, inst: Arc<Instance>) {
    use crate::fleet::engine_load::{fetch_metrics, parse};
    let text = fetch_metrics(&client, &inst.url, TIMEOUT).await;
    let reading = text.as_deref().and_then(parse);
    let outcome = if reading.is_some() { "ok" } else { "failed" };
    metrics::counter!(
        crate::telemetry::ENGINE_READINGS,
        "endpoint" => inst.endpoint.clone(),
        "upstream" => inst.id.clone(),
        "outcome" => outcome
    )
    .increment(1);
    match reading {
        Some(reading) => inst.engine_read(reading),
        None => {
            if inst.engine.failed_first() {
                tracing::warn!(endpoint = %inst.endpoint, instance = %inst.id, "no engine load readable at /metrics; routing on the gateway's own counts");
            }
        }
    }
}
