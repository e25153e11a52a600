//! Before a `kv_aware` run: wait until every gateway has heard every
//! instance's KV events. A ZeroMQ SUB socket misses what was published before
//! it subscribed, so each instance is sent small probe requests directly
//! (around the gateways) until each gateway's feed for it counts a batch.
//! The probes reach the instances' counters; [`crate::run`] subtracts them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use kvgate::AppState;
use kvgate_sim::SimHandle;
use serde_json::json;

/// Probe rounds an instance gets before the run gives up on it (20 ms apart).
const ROUNDS: usize = 500;

/// Until each of `gateways` (replicas serving `endpoint`) has counted an
/// event batch from each of `sims` (instance `i` of the endpoint is `sims[i]`).
pub async fn until_heard(
    gateways: &[Arc<AppState>],
    endpoint: &str,
    sims: &[SimHandle],
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().no_proxy().build()?;
    for (i, sim) in sims.iter().enumerate() {
        let mut round = 0;
        while !gateways.iter().all(|g| batches(g, endpoint, i) > 0) {
            if round == ROUNDS {
                anyhow::bail!(
                    "no gateway heard {}'s KV events after {ROUNDS} probes",
                    sim.server.config().name
                );
            }
            probe(&client, sim, round).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            round += 1;
        }
    }
    Ok(())
}

/// Event batches `gateway` has taken from instance `i` of `endpoint`.
pub fn batches(gateway: &AppState, endpoint: &str, i: usize) -> u64 {
    let rt = gateway.runtime.load_full();
    rt.endpoint(endpoint)
        .and_then(|e| e.instances.get(i))
        .and_then(|inst| inst.kv_feed())
        .map_or(0, |s| s.feed.counters.batches.load(Ordering::Relaxed))
}

/// One tiny chat request, unlike any workload's, sent straight to `sim`: its
/// prefill stores a block or two, which the instance publishes.
async fn probe(client: &reqwest::Client, sim: &SimHandle, round: usize) -> anyhow::Result<()> {
    let body = json!({
        "model": sim.server.config().model,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": format!("kv probe {round}. ").repeat(8)}],
    });
    client
        .post(format!("{}/v1/chat/completions", sim.url()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("probe of {}", sim.url()))?
        .bytes()
        .await?;
    Ok(())
}

/// [`until_heard`] for gateways in other processes: each one's `/metrics`
/// counts a batch from each instance (`kvgate_kv_events_applied_total`).
pub async fn until_heard_over_http(
    gateways: &[String],
    endpoint: &str,
    sims: &[SimHandle],
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().no_proxy().build()?;
    for (round, _) in (0..ROUNDS).enumerate() {
        let mut all = true;
        for g in gateways {
            let text = client
                .get(format!("{g}/metrics"))
                .send()
                .await?
                .text()
                .await?;
            let samples = crate::prom::parse(&text);
            let heard = |name: &str| {
                samples.iter().any(|s| {
                    s.name == "kvgate_kv_events_applied_total"
                        && s.label("endpoint") == Some(endpoint)
                        && s.label("upstream") == Some(name)
                        && s.value > 0.0
                })
            };
            all &= sims.iter().all(|s| heard(&s.server.config().name));
        }
        if all {
            return Ok(());
        }
        for sim in sims {
            probe(&client, sim, round).await?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("the gateways did not hear every instance's KV events after {ROUNDS} probes")
}
