//! Active health checks: probe every instance of endpoints that configure
//! `health`, and flip an instance out after `unhealthy_threshold` failed
//! probes in a row and back in after `healthy_threshold` good ones. The task
//! reads the current runtime each round, so a reload takes effect at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::fleet::AppState;

/// Run until the state is dropped by everyone else.
pub async fn run(state: std::sync::Weak<AppState>) {
    let mut next_due: HashMap<String, Instant> = HashMap::new();
    loop {
        let Some(state) = state.upgrade() else { return };
        let rt = state.runtime.load_full();
        drop(state);
        let now = Instant::now();
        let mut wait = Duration::from_secs(1);
        let mut probes = Vec::new();
        for ep in &rt.endpoints {
            let Some(h) = ep.config.health.clone() else {
                continue;
            };
            let due = next_due.entry(ep.name().to_owned()).or_insert(now);
            if *due <= now {
                *due = now + h.interval;
                for inst in &ep.instances {
                    let inst = Arc::clone(inst);
                    let client = rt.client.clone();
                    let h = h.clone();
                    probes.push(async move {
                        let url = format!("{}{}", inst.url, h.path);
                        let ok = matches!(
                            tokio::time::timeout(h.timeout, client.get(url).send()).await,
                            Ok(Ok(r)) if r.status().is_success()
                        );
                        inst.probe(ok, h.healthy_threshold, h.unhealthy_threshold);
                    });
                }
            }
            wait = wait.min(due.saturating_duration_since(now));
        }
        join_all(probes).await;
        tokio::time::sleep(wait.max(Duration::from_millis(20))).await;
    }
}
