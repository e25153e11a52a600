//! Instances found at run time, from DNS (re-resolved on an interval) or a
//! Kubernetes Service's EndpointSlices (watched). When an answer changes a
//! new runtime is published exactly as a reload does (in-flight counts
//! carried, only the moved share of prefixes moves). A lookup that fails or
//! comes back empty keeps the last known set, logged and counted: a DNS
//! hiccup must not empty a fleet.

pub mod dns;
pub mod kubernetes;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::config::discovery::Source;
use crate::fleet::AppState;
use crate::telemetry;

/// One discovered instance: a stable id (a pod's name, or the address) and
/// where it listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub addr: SocketAddr,
}

/// The last good answer of every endpoint's discovery, by endpoint name.
#[derive(Debug, Default)]
pub struct Discovered {
    sets: Mutex<HashMap<String, Answer>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Answer {
    /// The source it answers, so a reload that changes it drops the set.
    target: String,
    members: Vec<Member>,
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
            for m in &answer.members {
                let ic = crate::config::discovery::instance(d, &ep.routing, &m.id, m.addr);
                if !ep.instances.iter().any(|i| i.id == ic.id) {
                    ep.instances.push(ic);
                }
            }
        }
    }

    /// Record an answer; true when it differs from the last one.
    fn set(&self, endpoint: &str, target: String, members: Vec<Member>) -> bool {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let answer = Answer { target, members };
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

/// Run every endpoint's discovery until the state is gone: re-resolve DNS
/// when due, keep one EndpointSlice watch per Kubernetes source (started
/// and stopped as reloads add and remove them).
pub async fn run(state: Weak<AppState>) {
    let mut resolvers = HashMap::new();
    let mut due: HashMap<String, Instant> = HashMap::new();
    let mut watches: HashMap<(String, String), tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        let Some(strong) = state.upgrade() else { break };
        let config = std::sync::Arc::clone(&strong.runtime.load().config);
        strong.discovered.retain(&config);
        let mut changed = false;
        let mut next = Instant::now() + Duration::from_secs(1);
        let mut wanted = Vec::new();
        for ep in &config.endpoints {
            let Some(d) = &ep.discovery else { continue };
            let (host, port, server) = match &d.source {
                Source::Dns { host, port, server } => (host, *port, *server),
                Source::Kubernetes {
                    namespace,
                    service,
                    port,
                    api_server,
                } => {
                    let key = (ep.name.clone(), d.target());
                    if !watches.contains_key(&key) {
                        let watch = kubernetes::Watch {
                            endpoint: ep.name.clone(),
                            namespace: namespace.clone(),
                            service: service.clone(),
                            port: port.clone(),
                            api_server: api_server.clone(),
                        };
                        let task = tokio::spawn(watch_task(state.clone(), watch, d.target()));
                        watches.insert(key.clone(), task);
                    }
                    wanted.push(key);
                    continue;
                }
            };
            let now = Instant::now();
            if let Some(&at) = due.get(&ep.name).filter(|&&at| at > now) {
                next = next.min(at);
                continue;
            }
            due.insert(ep.name.clone(), now + d.interval);
            next = next.min(now + d.interval);
            let resolver = match resolvers.entry(server) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => match dns::resolver(server) {
                    Ok(r) => v.insert(r),
                    Err(e) => {
                        tracing::warn!(endpoint = %ep.name, error = %e, "cannot build a DNS resolver; keeping the last known instances");
                        telemetry::discovery_failure(&ep.name, "error");
                        continue;
                    }
                },
            };
            match dns::lookup(resolver, host, port).await {
                Ok(addrs) if addrs.is_empty() => {
                    tracing::warn!(endpoint = %ep.name, dns = %d.target(), "DNS answer is empty; keeping the last known instances");
                    telemetry::discovery_failure(&ep.name, "empty");
                }
                Ok(addrs) => {
                    telemetry::discovered(&ep.name, addrs.len());
                    let members = addrs
                        .into_iter()
                        .map(|addr| Member {
                            id: addr.to_string(),
                            addr,
                        })
                        .collect();
                    if strong.discovered.set(&ep.name, d.target(), members) {
                        tracing::info!(endpoint = %ep.name, dns = %d.target(), "discovered instances changed");
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
        watches.retain(|key, task| {
            let keep = wanted.contains(key);
            if !keep {
                task.abort();
            }
            keep
        });
        if changed {
            strong.republish();
        }
        drop(strong);
        tokio::time::sleep_until(next.into()).await;
    }
    for task in watches.into_values() {
        task.abort();
    }
}

/// One EndpointSlice watch, publishing each new member set.
async fn watch_task(state: Weak<AppState>, watch: kubernetes::Watch, target: String) {
    let endpoint = watch.endpoint.clone();
    let publish = |members: Vec<Member>| {
        let Some(state) = state.upgrade() else { return };
        telemetry::discovered(&endpoint, members.len());
        if state.discovered.set(&endpoint, target.clone(), members) {
            tracing::info!(endpoint = %endpoint, source = %target, "discovered instances changed");
            state.republish();
        }
    };
    let mut publish = publish;
    loop {
        // `follow` returns only when no API client can be built (no service
        // account, no kubeconfig) or its stream ends: say so, then try again.
        if let Err(e) = kubernetes::follow(watch.clone(), &mut publish).await {
            tracing::error!(endpoint = %watch.endpoint, error = %e, "cannot reach the Kubernetes API; keeping the last known instances, retrying in 5 s");
            telemetry::discovery_failure(&watch.endpoint, "error");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
