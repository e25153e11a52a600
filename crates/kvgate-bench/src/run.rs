//! One workload under one strategy: a fresh fleet, the sessions played through the
//! gateway, then the instances' counters and the gateway's metrics read back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvgate_sim::SimStats;

use crate::arm::Arm;
use crate::driver::{self, Record, Target};
use crate::fleet::Fleet;
use crate::prom::{self, Histogram};
use crate::workload::Setup;

const ROUTING_SECONDS: &str = "kvgate_routing_decision_seconds";
const DECISIONS: &str = "kvgate_routing_decisions_total";
const ENGINE_TTFT: &str = "vllm:time_to_first_token_seconds";

/// What one run measured. Times are simulated unless named `wall`.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub arm: Arm,
    pub requests: usize,
    pub failed: usize,
    pub first_error: Option<String>,
    /// Cached ÷ prompt tokens, summed over the instances' own counters.
    pub hit_rate: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Cached tokens as the clients read them from `usage` (a cross-check).
    pub usage_cached_tokens: u64,
    /// Hit rate (from `usage`) of first turns, second turns and later turns, for
    /// multi-turn workloads.
    pub hit_by_turn: Option<[f64; 3]>,
    /// Client-side time to the first SSE chunk, simulated seconds.
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub ttft_mean: f64,
    /// The instances' own TTFT (vLLM's histogram, simulated time, merged over the
    /// fleet, bucket-interpolated): what the client would see with no overheads.
    pub engine_ttft_p50: Option<f64>,
    pub engine_ttft_p90: Option<f64>,
    /// Completed requests and output tokens per simulated second, first send to
    /// last completion.
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Each instance's share of the requests it received.
    pub shares: Vec<f64>,
    /// Gateway decisions by outcome (affinity, overflow, fallback, balance, …).
    pub decisions: Vec<(String, u64)>,
    /// Gateway routing decision time, seconds (real: not scaled).
    pub routing_mean: Option<f64>,
    pub routing_p50: Option<f64>,
    pub routing_p99: Option<f64>,
    pub wall: Duration,
    /// The bodies sent, in send order, when asked for.
    pub bodies: Vec<bytes::Bytes>,
}

impl RunResult {
    pub fn decisions_of(&self, outcome: &str) -> u64 {
        self.decisions
            .iter()
            .filter(|(o, _)| o == outcome)
            .map(|(_, n)| *n)
            .sum()
    }

    /// Requests sent away from the instance that held the most of their prefix:
    /// `overflow` (`prefix_aware`: the key's instance was full) plus
    /// `cache_spread` (`longest_prefix`: a less-cached instance was cheaper).
    pub fn moved(&self) -> u64 {
        self.decisions_of("overflow") + self.decisions_of("cache_spread")
    }
}

/// Run `setup` under `arm`; `tag` makes the endpoint name unique in this process.
pub async fn run(
    setup: &Setup,
    arm: Arm,
    tag: &str,
    record_bodies: bool,
) -> anyhow::Result<RunResult> {
    let endpoint = format!("{}-{}-{tag}", setup.id, arm.label());
    let fleet = Fleet::start(setup, arm, &endpoint).await?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1024)
        .build()?;
    // The recorder is process-wide: any replica's /metrics has every replica's
    // decisions. The instances' counters and histograms are read before and
    // after, so `kv_aware`'s subscription probes do not count.
    let gateway = fleet.gateways.first().cloned().unwrap_or_default();
    let before = metrics(&client, &gateway).await?;
    let stats_before = fleet.stats();
    let engine_before = engine_ttft(&client, &fleet).await?;
    let target = Target {
        client: client.clone(),
        bases: fleet.gateways.clone().into(),
        next: Arc::default(),
        model: endpoint.clone(),
        time_scale: setup.sim.time_scale,
        record_bodies,
    };
    let started = Instant::now();
    let mut records = driver::drive(&target, &setup.sessions).await;
    let wall = started.elapsed();
    let after = metrics(&client, &gateway).await?;
    let stats: Vec<SimStats> = fleet
        .stats()
        .iter()
        .zip(&stats_before)
        .map(|(a, b)| since(a, b))
        .collect();
    let engine = engine_ttft(&client, &fleet).await?.since(&engine_before);
    fleet.shutdown().await;

    records.sort_by_key(|r| r.sent);
    let scale = setup.sim.time_scale.max(1e-9);
    let sim_secs = |d: Duration| d.as_secs_f64() / scale;
    let failed: Vec<&Record> = records
        .iter()
        .filter(|r| r.outcome.error.is_some())
        .collect();
    let mut ttfts: Vec<f64> = records
        .iter()
        .filter_map(|r| r.outcome.ttft.map(sim_secs))
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let first = records.first().map_or(Duration::ZERO, |r| r.sent);
    let last = records
        .iter()
        .map(|r| r.sent + r.outcome.total)
        .max()
        .unwrap_or(first);
    let span = sim_secs(last.saturating_sub(first)).max(1e-9);
    let prompt_tokens: u64 = stats.iter().map(|s| s.prompt_tokens).sum();
    let cached_tokens: u64 = stats.iter().map(|s| s.cached_tokens).sum();
    let output: u64 = stats.iter().map(|s| s.generation_tokens).sum();
    let received: u64 = stats.iter().map(|s| s.requests).sum();
    let routing =
        Histogram::read(&after, ROUTING_SECONDS).since(&Histogram::read(&before, ROUTING_SECONDS));
    let ok = records.len() - failed.len();
    Ok(RunResult {
        arm,
        requests: records.len(),
        failed: failed.len(),
        first_error: failed.first().and_then(|r| r.outcome.error.clone()),
        hit_rate: ratio(cached_tokens, prompt_tokens),
        prompt_tokens,
        cached_tokens,
        usage_cached_tokens: records.iter().map(|r| r.outcome.cached_tokens).sum(),
        hit_by_turn: hit_by_turn(&records),
        ttft_p50: percentile(&ttfts, 0.5),
        ttft_p90: percentile(&ttfts, 0.9),
        ttft_mean: ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64,
        engine_ttft_p50: engine.quantile(0.5),
        engine_ttft_p90: engine.quantile(0.9),
        requests_per_s: ok as f64 / span,
        output_tokens_per_s: output as f64 / span,
        shares: stats.iter().map(|s| ratio(s.requests, received)).collect(),
        decisions: decisions(&after, &endpoint),
        routing_mean: routing.mean(),
        routing_p50: routing.quantile(0.5),
        routing_p99: routing.quantile(0.99),
        wall,
        bodies: records.into_iter().filter_map(|r| r.body).collect(),
    })
}

/// The instances' TTFT histograms, merged.
async fn engine_ttft(client: &reqwest::Client, fleet: &Fleet) -> anyhow::Result<Histogram> {
    let mut engine = Histogram::default();
    for sim in &fleet.sims {
        let samples = metrics(client, &sim.url()).await?;
        engine = engine.plus(&Histogram::read(&samples, ENGINE_TTFT));
    }
    Ok(engine)
}

/// The counters `a` gained since `b` (gauges as in `a`).
fn since(a: &SimStats, b: &SimStats) -> SimStats {
    SimStats {
        requests: a.requests.saturating_sub(b.requests),
        prompt_tokens: a.prompt_tokens.saturating_sub(b.prompt_tokens),
        cached_tokens: a.cached_tokens.saturating_sub(b.cached_tokens),
        queries_tokens: a.queries_tokens.saturating_sub(b.queries_tokens),
        aborted: a.aborted.saturating_sub(b.aborted),
        generation_tokens: a.generation_tokens.saturating_sub(b.generation_tokens),
        ..a.clone()
    }
}

async fn metrics(client: &reqwest::Client, base: &str) -> anyhow::Result<Vec<prom::Sample>> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("GET {base}/metrics"))?
        .text()
        .await?;
    Ok(prom::parse(&text))
}

/// Routing decisions of `endpoint`, summed over instances, by outcome.
fn decisions(samples: &[prom::Sample], endpoint: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for s in samples
        .iter()
        .filter(|s| s.name == DECISIONS && s.label("endpoint") == Some(endpoint))
    {
        let outcome = s.label("outcome").unwrap_or("?").to_owned();
        let n = s.value.max(0.0) as u64;
        match out.iter_mut().find(|(o, _)| *o == outcome) {
            Some((_, total)) => *total += n,
            None => out.push((outcome, n)),
        }
    }
    out.sort();
    out
}

fn hit_by_turn(records: &[Record]) -> Option<[f64; 3]> {
    if records.iter().all(|r| r.turn == 0) {
        return None;
    }
    let mut sums = [(0u64, 0u64); 3];
    for r in records {
        let slot = &mut sums[r.turn.min(2)];
        slot.0 += r.outcome.cached_tokens;
        slot.1 += r.outcome.prompt_tokens;
    }
    Some(sums.map(|(c, p)| ratio(c, p)))
}

pub fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Nearest-rank percentile of sorted `v` (0 when empty).
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = (q * v.len() as f64).ceil() as usize;
    v.get(rank.clamp(1, v.len()) - 1).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.9), 9.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(ratio(1, 0), 0.0);
    }
}
