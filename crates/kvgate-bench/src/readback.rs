//! What is read back from a fleet around a run: the instances' counters,
//! TTFT histograms and per-request times (joined to the client's records by
//! response id), and the gateway's decisions.

use std::collections::HashMap;

use anyhow::Context;
use kvgate_sim::{Latencies, SimStats};

use crate::driver::Record;
use crate::fleet::Fleet;
use crate::prom::{self, Histogram};

const DECISIONS: &str = "kvgate_routing_decisions_total";
const ENGINE_TTFT: &str = "vllm:time_to_first_token_seconds";

/// The instances' TTFT histograms, merged.
pub async fn engine_ttft(client: &reqwest::Client, fleet: &Fleet) -> anyhow::Result<Histogram> {
    let mut engine = Histogram::default();
    for sim in &fleet.sims {
        let samples = metrics(client, &sim.url()).await?;
        engine = engine.plus(&Histogram::read(&samples, ENGINE_TTFT));
    }
    Ok(engine)
}

/// The counters `a` gained since `b` (gauges as in `a`).
pub fn since(a: &SimStats, b: &SimStats) -> SimStats {
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

pub async fn metrics(client: &reqwest::Client, base: &str) -> anyhow::Result<Vec<prom::Sample>> {
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
pub fn decisions(samples: &[prom::Sample], endpoint: &str) -> Vec<(String, u64)> {
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

/// Give each record its TTFT and end-to-end time on its instance's clock,
/// found by its response's id (`{chatcmpl,cmpl}-{instance name}-{serial}`,
/// or a message's `msg_{instance name}-{serial}`) in `logs` (one an instance, named `names[i]`). Requests the run did not
/// send (`kv_aware`'s probes) are never looked up.
pub fn attach_engine_times(records: &mut [Record], names: &[String], logs: &[Latencies]) {
    let mut times: HashMap<(usize, u64), (Option<f64>, Option<f64>)> = HashMap::new();
    for (i, log) in logs.iter().enumerate() {
        for &(serial, t) in &log.ttft {
            times.entry((i, serial)).or_default().0 = Some(t);
        }
        for &(serial, t) in &log.e2e {
            times.entry((i, serial)).or_default().1 = Some(t);
        }
    }
    for r in records {
        let found = instance_and_serial(&r.outcome.id).and_then(|(name, serial)| {
            let i = names.iter().position(|n| n == name)?;
            times.get(&(i, serial.parse().ok()?))
        });
        if let Some(&(Some(ttft), Some(e2e))) = found {
            r.engine = Some((ttft, e2e));
        }
    }
}

/// The instance's name and the serial there in a response id
/// (`{chatcmpl,cmpl}-{instance name}-{serial}`, or `msg_{instance name}-{serial}`).
pub fn instance_and_serial(id: &str) -> Option<(&str, &str)> {
    id.strip_prefix("msg_")
        .or_else(|| id.split_once('-').map(|(_, rest)| rest))
        .and_then(|rest| rest.rsplit_once('-'))
}

/// Completed requests per second on the instances' clock, with the real
/// overheads of HTTP, the gateway and the load generator (magnified by
/// 1/time_scale) taken out. Each chain (a session in the open loop, a
/// client in the closed) is replayed on that clock: from its start, each
/// request in send order after its think time, for its end-to-end time on
/// its instance; the span runs from the first chain's start to the last
/// one's end. So in the closed loop it is the longest client's sum of its
/// requests' end-to-end times. `None` when a completed request has no
/// engine times.
pub fn engine_throughput(records: &[Record]) -> Option<f64> {
    let done: Vec<&Record> = records
        .iter()
        .filter(|r| r.outcome.error.is_none())
        .collect();
    if done.iter().any(|r| r.engine.is_none()) || done.is_empty() {
        return None;
    }
    let mut chains: HashMap<usize, Vec<&Record>> = HashMap::new();
    for r in done.iter().copied() {
        chains.entry(r.chain).or_default().push(r);
    }
    let (mut first, mut last) = (f64::INFINITY, 0.0f64);
    for chain in chains.values_mut() {
        chain.sort_by_key(|r| r.sent);
        let start = chain.first().map_or(0.0, |r| r.chain_start.as_secs_f64());
        let end = chain.iter().fold(start, |t, r| {
            t + r.think.as_secs_f64() + r.engine.map_or(0.0, |(_, e)| e)
        });
        first = first.min(start);
        last = last.max(end);
    }
    Some(done.len() as f64 / (last - first).max(1e-9))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::Outcome;

    fn record(id: &str) -> Record {
        Record {
            sent: Duration::ZERO,
            turn: 0,
            chain: 0,
            chain_start: Duration::ZERO,
            think: Duration::ZERO,
            engine: None,
            outcome: Outcome {
                id: id.to_owned(),
                ..Outcome::default()
            },
            body: None,
        }
    }

    #[test]
    fn chat_completion_and_message_ids_find_their_engine_times() {
        let names = ["sim-0".to_owned(), "sim-1".to_owned()];
        let log = |serial: u64, t: f64| Latencies {
            ttft: vec![(serial, t)],
            e2e: vec![(serial, 2.0 * t)],
        };
        let logs = [log(3, 0.5), log(7, 0.25)];
        let mut records = [
            record("chatcmpl-sim-1-7"),
            record("msg_sim-0-3"),
            record("cmpl-sim-0-3"),
            record("msg_sim-1-3"),
        ];
        attach_engine_times(&mut records, &names, &logs);
        let engine: Vec<_> = records.iter().map(|r| r.engine).collect();
        assert_eq!(
            engine,
            [Some((0.25, 0.5)), Some((0.5, 1.0)), Some((0.5, 1.0)), None]
        );
    }
}
