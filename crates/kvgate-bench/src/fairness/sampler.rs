//! Once a simulated second: the gateway's `/metrics` (every replica's, summed) (each tenant's weighted
//! service, `kvgate_tenant_service_total`, and its requests waiting in the
//! queue, `kvgate_queue_waiting`), its CPU time, and the instances' own
//! gauges and counters (running, waiting, KV usage, tokens processed).

use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::SimHandle;
use tokio::sync::watch;
use tokio::time::Instant;

use super::tenants::TENANTS;
use crate::prom;

const SERVICE: &str = "kvgate_tenant_service_total";
const WAITING: &str = "kvgate_queue_waiting";

/// One reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Simulated seconds since the first arrival was due.
    pub t: f64,
    /// Weighted service each tenant has received, as the gateway counts it
    /// (0 where it exports none: the queue off).
    pub service: [f64; 3],
    /// Requests of each tenant waiting in the gateway's queue (all priorities).
    pub waiting: [f64; 3],
    /// Over the instances: sequences running, requests waiting, mean KV use.
    pub engine_running: usize,
    pub engine_waiting: usize,
    pub kv_usage: f64,
    /// Prompt tokens admitted plus output tokens generated, over the instances.
    pub engine_tokens: u64,
    /// The gateway process's CPU seconds so far.
    pub gateway_cpu: f64,
}

/// Take `sample`'s gateway part from `/metrics` text.
pub fn read_gateway(text: &str, sample: &mut Sample) {
    for s in prom::parse(text) {
        let slot = match s.name.as_str() {
            SERVICE => &mut sample.service,
            WAITING => &mut sample.waiting,
            _ => continue,
        };
        if let Some(i) = s
            .label("tenant")
            .and_then(|t| TENANTS.iter().position(|x| x.name == t))
        {
            slot[i] += s.value;
        }
    }
}

fn read_engines(sims: &[SimHandle], sample: &mut Sample) {
    for sim in sims {
        let s = sim.server.stats();
        sample.engine_running += s.running;
        sample.engine_waiting += s.waiting;
        sample.kv_usage += s.kv_blocks_in_use as f64 / s.kv_blocks_total.max(1) as f64;
        sample.engine_tokens += s.queries_tokens + s.generation_tokens;
    }
    sample.kv_usage /= sims.len().max(1) as f64;
}

/// Read every `time_scale` real seconds from `t0` until `stop` turns true;
/// the samples in order.
pub async fn run(
    gateways: Vec<String>,
    cpu: impl Fn() -> f64,
    sims: Arc<Vec<SimHandle>>,
    t0: Instant,
    time_scale: f64,
    mut stop: watch::Receiver<bool>,
) -> Vec<Sample> {
    let client = reqwest::Client::builder().no_proxy().build().ok();
    let period = Duration::from_secs_f64(time_scale.max(1e-3));
    let mut tick = tokio::time::interval_at(t0, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {}
        }
        let mut sample = Sample {
            t: t0.elapsed().as_secs_f64() / time_scale.max(1e-9),
            gateway_cpu: cpu(),
            ..Sample::default()
        };
        read_engines(&sims, &mut sample);
        // Replicas count their own service and queues: summed, the fleet's.
        for gateway in &gateways {
            if let Some(c) = &client
                && let Ok(r) = c.get(format!("{gateway}/metrics")).send().await
                && let Ok(text) = r.text().await
            {
                read_gateway(&text, &mut sample);
            }
        }
        out.push(sample);
        if *stop.borrow() {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_and_waiting_are_summed_per_tenant() {
        let text = r#"# TYPE kvgate_tenant_service_total counter
kvgate_tenant_service_total{endpoint="chat",tenant="flood"} 1200
kvgate_tenant_service_total{endpoint="chat",tenant="steady"} 800.5
kvgate_queue_waiting{endpoint="chat",tenant="vip",priority="high"} 2
kvgate_queue_waiting{endpoint="chat",tenant="vip",priority="normal"} 1
kvgate_queue_waiting{endpoint="chat",tenant="someone",priority="low"} 9
kvgate_queue_released_total{endpoint="chat",tenant="flood",priority="normal"} 5
"#;
        let mut s = Sample::default();
        read_gateway(text, &mut s);
        assert_eq!(s.service, [1200.0, 800.5, 0.0]);
        assert_eq!(s.waiting, [0.0, 0.0, 3.0]);
    }
}
