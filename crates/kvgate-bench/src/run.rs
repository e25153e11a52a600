//! One workload under one strategy: a fresh fleet, the sessions played through the
//! gateway, then the instances' counters and the gateway's metrics read back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_sim::SimStats;

use crate::arm::Arm;
use crate::closed;
use crate::driver::{self, Record, Target};
use crate::fleet::Fleet;
use crate::prom::Histogram;
use crate::readback::{
    attach_engine_times, decisions, engine_throughput, engine_ttft, metrics, since,
};
use crate::regime::Arrivals;
use crate::workload::Setup;

const ROUTING_SECONDS: &str = "kvgate_routing_decision_seconds";

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
    /// The same from each request's own time on the instances' clocks, exact
    /// (P50, P90): first token, and last token (the whole answer).
    pub engine_ttft_exact: (f64, f64),
    pub engine_e2e: (f64, f64),
    /// Client-side time to the whole answer (P50, P90), simulated seconds.
    pub e2e: (f64, f64),
    /// Completed requests and output tokens per simulated second, first send to
    /// last completion.
    pub requests_per_s: f64,
    /// The same on the instances' clock, the real overheads taken out
    /// ([`crate::readback::engine_throughput`]).
    pub engine_requests_per_s: Option<f64>,
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
    /// Each instance's most requests running and waiting at once, sampled
    /// every 10 ms (real) while the run went.
    pub peak_in_flight: Vec<usize>,
    /// What the replicas' sharing cost Redis over the run (replicas as
    /// processes only).
    pub redis: Option<crate::redis_proc::Traffic>,
    /// Bytes of prompt a token the gateway learned from the engines'
    /// answers by the run's end (`None`: still on its 4-a-token guess).
    pub learned_bytes_per_token: Option<f64>,
    /// Chains (sessions, conversations) whose every answered request came
    /// from one instance, of the chains with an answered request.
    pub chains_kept: (usize, usize),
    /// The paths and bodies sent, in send order, when asked for.
    pub bodies: Vec<(&'static str, bytes::Bytes)>,
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

/// Run `setup` under `arm`; `tag` makes the endpoint name unique in this
/// process. `gateway_metrics`: read the gateway's decisions and routing time
/// (its `/metrics` holds every run's series so far, so a long matrix skips it).
pub async fn run(
    setup: &Setup,
    arm: Arm,
    tag: &str,
    record_bodies: bool,
    gateway_metrics: bool,
) -> anyhow::Result<RunResult> {
    let endpoint = format!("{}-{}-{tag}", setup.id, arm.label());
    let fleet = Fleet::start(setup, arm, &endpoint).await?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1024)
        .build()?;
    // In this process the recorder is process-wide: any replica's /metrics
    // has every replica's decisions; replicas as processes have their own,
    // summed. The instances' counters and histograms are read before and
    // after, so `kv_aware`'s subscription probes do not count.
    let gateways: Vec<String> = if setup.separate_processes {
        fleet.gateways.clone()
    } else {
        fleet.gateways.first().cloned().into_iter().collect()
    };
    let gateway_samples = || async {
        let mut all = Vec::new();
        for g in &gateways {
            all.extend(metrics(&client, g).await?);
        }
        anyhow::Ok(all)
    };
    let before = if gateway_metrics {
        gateway_samples().await?
    } else {
        Vec::new()
    };
    let redis_before = match &fleet.redis {
        Some(r) => r.traffic().await,
        None => None,
    };
    let peaks = peak_sampler(&fleet);
    let stats_before = fleet.stats();
    let engine_before = engine_ttft(&client, &fleet).await?;
    let target = Target {
        client: client.clone(),
        bases: fleet.gateways.clone().into(),
        next: Arc::default(),
        model: endpoint.clone(),
        time_scale: setup.sim.time_scale,
        record_bodies,
        stream: setup.regime.stream,
        api: setup.regime.api,
        density: setup.density,
    };
    let started = Instant::now();
    // Open loop: each session at its start time; closed: `clients` at a time.
    let mut records = match setup.regime.arrivals {
        Arrivals::Open => driver::drive(&target, &setup.sessions).await,
        Arrivals::Closed(clients) => closed::drive(&target, &setup.sessions, clients).await,
    };
    let wall = started.elapsed();
    let after = if gateway_metrics {
        gateway_samples().await?
    } else {
        Vec::new()
    };
    let redis = match (&fleet.redis, redis_before) {
        (Some(r), Some(before)) => r.traffic().await.map(|t| t.since(&before)),
        _ => None,
    };
    peaks.0.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak_in_flight = peaks.1.await.unwrap_or_default();
    let stats: Vec<SimStats> = fleet
        .stats()
        .iter()
        .zip(&stats_before)
        .map(|(a, b)| since(a, b))
        .collect();
    let engine = engine_ttft(&client, &fleet).await?.since(&engine_before);
    let names: Vec<String> = fleet
        .sims
        .iter()
        .map(|s| s.server.config().name.clone())
        .collect();
    attach_engine_times(&mut records, &names, &fleet.latencies());
    let learned_bytes_per_token = fleet.learned_bytes_per_token();
    fleet.shutdown().await;

    records.sort_by_key(|r| r.sent);
    crate::records::dump(arm, &records);
    let engine_times = |pick: fn((f64, f64)) -> f64| {
        let mut v: Vec<f64> = records.iter().filter_map(|r| r.engine.map(pick)).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (engine_ttfts, engine_e2es) = (engine_times(|t| t.0), engine_times(|t| t.1));
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
    let mut e2es: Vec<f64> = records
        .iter()
        .filter(|r| r.outcome.error.is_none())
        .map(|r| sim_secs(r.outcome.total))
        .collect();
    e2es.sort_by(f64::total_cmp);
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
        engine_ttft_exact: (
            percentile(&engine_ttfts, 0.5),
            percentile(&engine_ttfts, 0.9),
        ),
        engine_e2e: (percentile(&engine_e2es, 0.5), percentile(&engine_e2es, 0.9)),
        e2e: (percentile(&e2es, 0.5), percentile(&e2es, 0.9)),
        requests_per_s: ok as f64 / span,
        engine_requests_per_s: engine_throughput(&records),
        output_tokens_per_s: output as f64 / span,
        shares: stats.iter().map(|s| ratio(s.requests, received)).collect(),
        decisions: decisions(&after, &endpoint),
        routing_mean: routing.mean(),
        routing_p50: routing.quantile(0.5),
        routing_p99: routing.quantile(0.99),
        wall,
        peak_in_flight,
        redis,
        learned_bytes_per_token,
        chains_kept: chains_kept(&records),
        bodies: records.into_iter().filter_map(|r| r.body).collect(),
    })
}

/// Sample each instance's running + waiting every 10 ms until told to stop;
/// the most of each.
fn peak_sampler(
    fleet: &Fleet,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<Vec<usize>>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let servers: Vec<_> = fleet.sims.iter().map(|s| Arc::clone(&s.server)).collect();
    let flag = Arc::clone(&stop);
    let task = tokio::spawn(async move {
        let mut peak = vec![0usize; servers.len()];
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            for (p, s) in peak.iter_mut().zip(&servers) {
                let st = s.stats();
                *p = (*p).max(st.running + st.waiting);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        peak
    });
    (stop, task)
}

/// Chains whose answered requests all came from one instance (named in the
/// answer's id), and chains with an answered request.
fn chains_kept(records: &[Record]) -> (usize, usize) {
    let mut homes: std::collections::HashMap<usize, Option<String>> = Default::default();
    for r in records {
        let Some((name, _)) = crate::readback::instance_and_serial(&r.outcome.id) else {
            continue;
        };
        homes
            .entry(r.chain)
            .and_modify(|home| {
                if home.as_deref() != Some(name) {
                    *home = None;
                }
            })
            .or_insert_with(|| Some(name.to_owned()));
    }
    (homes.values().filter(|h| h.is_some()).count(), homes.len())
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
