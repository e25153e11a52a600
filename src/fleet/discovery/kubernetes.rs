//! A Service's instances from its EndpointSlices, watched through the
//! Kubernetes API (`kube`'s watcher: list, then watch from that version,
//! re-listing when the watch expires). An endpoint is an instance while it
//! is ready and not terminating; its id is its pod's name. A terminating pod
//! leaves the set at once, so it takes no new requests while the ones it has
//! finish (they hold the instance, as after a reload).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use super::Member;
use crate::config::discovery::Port;

/// What a watch is asked to follow.
#[derive(Debug, Clone)]
pub struct Watch {
    /// The kvgate endpoint it feeds (for logs and metrics).
    pub endpoint: String,
    pub namespace: String,
    pub service: String,
    pub port: Port,
    pub api_server: Option<String>,
}

/// Follow the Service's slices; call `publish` with the full member set
/// after the initial list and after every change to it. Returns only if the
/// API client cannot be built.
pub async fn follow(watch: Watch, mut publish: impl FnMut(Vec<Member>)) -> Result<(), String> {
    let client = match &watch.api_server {
        Some(url) => {
            let uri = url.parse::<http::Uri>().map_err(|e| e.to_string())?;
            Client::try_from(kube::Config::new(uri)).map_err(|e| e.to_string())?
        }
        None => Client::try_default().await.map_err(|e| e.to_string())?,
    };
    let api: Api<EndpointSlice> = Api::namespaced(client, &watch.namespace);
    let selector = format!("kubernetes.io/service-name={}", watch.service);
    let mut events = watcher::watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let mut slices: HashMap<String, EndpointSlice> = HashMap::new();
    let mut listing: Option<HashMap<String, EndpointSlice>> = None;
    let mut last: Option<Vec<Member>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listing = Some(HashMap::new()),
            Ok(Event::InitApply(s)) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(slice_name(&s), s);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(l) = listing.take() {
                    slices = l;
                }
            }
            Ok(Event::Apply(s)) => {
                slices.insert(slice_name(&s), s);
            }
            Ok(Event::Delete(s)) => {
                slices.remove(&slice_name(&s));
            }
            Err(e) => {
                tracing::warn!(endpoint = %watch.endpoint, namespace = %watch.namespace, service = %watch.service, error = %e, "EndpointSlice watch failed; keeping the last known instances and retrying");
                crate::telemetry::discovery_failure(&watch.endpoint, "error");
                continue;
            }
        }
        if listing.is_some() {
            continue;
        }
        let members = members(&slices, &watch.port);
        if last.as_ref() != Some(&members) {
            last = Some(members.clone());
            publish(members);
        }
    }
    Ok(())
}

fn slice_name(s: &EndpointSlice) -> String {
    s.metadata.name.clone().unwrap_or_default()
}

/// Ready, not terminating endpoints of every slice, sorted by id. An
/// endpoint's `ready` left unset means ready, as the API documents.
pub fn members(slices: &HashMap<String, EndpointSlice>, port: &Port) -> Vec<Member> {
    let mut out: Vec<Member> = Vec::new();
    for slice in slices.values() {
        let number = match port {
            Port::Number(n) => Some(*n),
            Port::Name(name) => slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok()),
        };
        let Some(number) = number else { continue };
        for ep in &slice.endpoints {
            let c = ep.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            if !ready || terminating {
                continue;
            }
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let addr = SocketAddr::new(ip, number);
            let id = ep
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_else(|| addr.to_string());
            if !out.iter().any(|m| m.id == id) {
                out.push(Member { id, addr });
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}
