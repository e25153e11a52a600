//! Instances found at run time. A task re-resolves each endpoint's
//! `discovery` on its interval; when an answer changes it publishes a new
//! runtime exactly as a reload does (in-flight counts carried, only the moved
//! share of prefixes moves). A lookup that fails or comes back empty keeps the
//! last known set, logged and counted: a DNS hiccup must not empty a fleet.

pub mod dns;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::state::AppState;
use crate::telemetry;

/// The last good answer of every endpoint's discovery, by endpoint name.
#[derive(Debug, Default)]
pub struct Discovered {
    sets: Mutex<HashMap<String, Answer>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Answer {
    /// The `host:port` it answers, so a reload that changes it drops the set.
    target: String,
    addrs: Vec<SocketAddr>,
}

impl Discovered {
    /// Replace the instances discovery added to `config` with the current
    /// answers. Static instances win an id clash.
    pub fn merge(&self, config: &mut Config) {
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        for ep in &mut config.endpoints {
            ep.instances.retain(|i| !i.discovered);
            let Some(d) = &ep.discovery else { continue };
            let Some(answer) = sets.get(&ep.name).filter(|a| a.target == d.target()) else {
                continue;
            };
            for &addr in &answer.addrs {
                let ic = crate::config::discovery::instance(d, &ep.routing, addr);
                if !ep.instances.iter().any(|i| i.id == ic.id) {
                    ep.instances.push(ic);
                }
            }
        }
    }

    /// Record an answer; true when it differs from the last one.
    fn set(&self, endpoint: &str, target: String, addrs: Vec<SocketAddr>) -> bool {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let answer = Answer { target, addrs };
        if sets.get(endpoint) == Some(&answer) {
            return false;
        }
        sets.insert(endpoint.to_owned(), answer);
        true
    }

    /// Forget endpoints that no longer exist.
    fn retain(&self, config: &Config) {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        sets.retain(|name, _| {
            config
                .endpoints
                .iter()
                .any(|e| &e.name == name && e.discovery.is_some())
        });
    }
}

/// Re-resolve every endpoint's discovery when due, until the state is gone.
pub async fn run(state: Weak<AppState>) {
    let mut resolvers = HashMap::new();
    let mut due: HashMap<String, Instant> = HashMap::new();
    loop {
        let Some(state) = state.upgrade() else { return };
        let config = std::sync::Arc::clone(&state.runtime.load().config);
        state.discovered.retain(&config);
        let mut changed = false;
        let mut next = Instant::now() + Duration::from_secs(1);
        for ep in &config.endpoints {
            let Some(d) = &ep.discovery else { continue };
            let now = Instant::now();
            if let Some(&at) = due.get(&ep.name).filter(|&&at| at > now) {
                next = next.min(at);
                continue;
            }
            due.insert(ep.name.clone(), now + d.interval);
            next = next.min(now + d.interval);
            let resolver = match resolvers.entry(d.server) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => match dns::resolver(d.server) {
                    Ok(r) => v.insert(r),
                    Err(e) => {
                        tracing::warn!(endpoint = %ep.name, error = %e, "cannot build a DNS resolver; keeping the last known instances");
                        telemetry::discovery_failure(&ep.name, "error");
                        continue;
                    }
                },
            };
            match dns::lookup(resolver, &d.host, d.port).await {
                Ok(addrs) if addrs.is_empty() => {
                    tracing::warn!(endpoint = %ep.name, dns = %d.target(), "DNS answer is empty; keeping the last known instances");
                    telemetry::discovery_failure(&ep.name, "empty");
                }
                Ok(addrs) => {
                    telemetry::discovered(&ep.name, addrs.len());
                    if state.discovered.set(&ep.name, d.target(), addrs.clone()) {
                        tracing::info!(endpoint = %ep.name, dns = %d.target(), instances = ?addrs, "discovered instances changed");
                        changed = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(endpoint = %ep.name, dns = %d.target(), error = %e, "DNS lookup failed; keeping the last known instances");
                    telemetry::discovery_failure(&ep.name, "error");
                }
            }
        }
        due.retain(|name, _| config.endpoints.iter().any(|e| &e.name == name));
        if changed {
            state.republish();
        }
        drop(state);
        tokio::time::sleep_until(next.into()).await;
    }
}
