//! Everything derived from config, swapped as one: endpoints with their
//! instances and policies, model and name lookups, and the upstream client.
//! A request loads the [`Runtime`] once and sees the old world or the new one,
//! never a mix. Instances are carried over by (endpoint, id) so in-flight
//! counts survive a reload.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;

use super::client::ClientError;
use super::{Endpoint, Instance};
use crate::config::Config;

#[derive(Debug)]
pub struct Runtime {
    pub config: Arc<Config>,
    pub endpoints: Vec<Arc<Endpoint>>,
    by_model: HashMap<String, Arc<Endpoint>>,
    by_name: HashMap<String, Arc<Endpoint>>,
    /// Health checks, capacity probes, warm-up.
    pub client: reqwest::Client,
    /// The proxy path's clients (hyper's, directly), one per connection worker.
    pub proxies: crate::fleet::client::Proxies,
    /// Authentication, tenant limits and salts; counters carried across reloads.
    pub tenancy: Arc<crate::tenancy::Tenancy>,
    /// The console's decision ring and reload note, carried across reloads.
    pub live: Arc<crate::telemetry::live::Live>,
    /// Routing and fair-queue state shared with the other replicas
    /// (`cluster.sync_ms`); kept across reloads with the cluster.
    pub peers: Option<Arc<super::peers::Peers>>,
    /// Instances this build added to running endpoints, to be warmed:
    /// (endpoint name, instance).
    joined: Vec<(String, Arc<Instance>)>,
}

impl Runtime {
    /// Build from a validated config, reusing `previous`'s instances where
    /// endpoint name and instance id match.
    pub fn build(config: Config, previous: Option<&Runtime>) -> Result<Self, ClientError> {
        // The recorder first: instances resolve their metric handles from it.
        crate::telemetry::handle();
        let client = probe_client(&config)?;
        let proxies = crate::fleet::client::Proxies::build(
            &config.upstream_tls,
            config.server.timeouts.connect,
            config.server.workers,
        )?;
        let mut endpoints = Vec::with_capacity(config.endpoints.len());
        let mut joined = Vec::new();
        let mut by_model = HashMap::new();
        let mut by_name = HashMap::new();
        for ec in &config.endpoints {
            let old = previous.and_then(|p| p.endpoint(&ec.name));
            let (ep, new) = Endpoint::build(ec, old.map(|o| o.as_ref()), &config.queue);
            joined.extend(new.into_iter().map(|i| (ec.name.clone(), i)));
            for m in &ec.models {
                by_model.insert(m.clone(), Arc::clone(&ep));
            }
            by_name.insert(ec.name.clone(), Arc::clone(&ep));
            endpoints.push(ep);
        }
        // One Redis connection and heartbeat per process, kept across
        // reloads that leave `cluster` as it was.
        let cluster = config.cluster.as_ref().and_then(|c| {
            previous
                .and_then(|p| p.tenancy.cluster())
                .filter(|old| old.config == *c)
                .cloned()
                .or_else(|| crate::tenancy::cluster::Cluster::start(c))
        });
        let peers = cluster.as_ref().and_then(|c| {
            previous
                .and_then(|p| p.peers.clone())
                .filter(|old| Arc::ptr_eq(&old.cluster, c))
                .or_else(|| super::peers::Peers::new(c))
        });
        let tenancy =
            crate::tenancy::Tenancy::build(&config.tenancy, previous.map(|p| &*p.tenancy), cluster);
        Ok(Self {
            config: Arc::new(config),
            endpoints,
            by_model,
            by_name,
            client,
            proxies,
            tenancy: Arc::new(tenancy),
            live: previous.map_or_else(Default::default, |p| Arc::clone(&p.live)),
            peers,
            joined,
        })
    }

    pub fn endpoint(&self, name: &str) -> Option<&Arc<Endpoint>> {
        self.by_name.get(name)
    }

    pub fn endpoint_for_model(&self, model: &str) -> Option<&Arc<Endpoint>> {
        self.by_model.get(model)
    }

    /// Every configured model, in config order.
    pub fn models(&self) -> impl Iterator<Item = (&str, &str)> {
        self.endpoints
            .iter()
            .flat_map(|e| e.config.models.iter().map(move |m| (m.as_str(), e.name())))
    }
}

/// The client for health checks, capacity probes, engine readings and warm-up.
fn probe_client(config: &Config) -> Result<reqwest::Client, ClientError> {
    Ok(config
        .upstream_tls
        .apply(reqwest::Client::builder())
        .connect_timeout(config.server.timeouts.connect)
        .tcp_nodelay(true)
        // Below the keep-alive of uvicorn (vLLM, SGLang) and llama-server,
        // 5 s: reusing a connection the server has just closed would fail
        // the request over and cool a healthy instance down.
        .pool_idle_timeout(std::time::Duration::from_secs(4))
        .pool_max_idle_per_host(1024)
        // HTTP/1 to every instance, TLS or not: the engines speak it and the
        // pool settings above are for it (test builds enable reqwest's
        // http2, which ALPN would otherwise pick against a TLS instance).
        .http1_only()
        .no_proxy()
        // A probe reports what the instance answered; it follows nothing.
        .redirect(reqwest::redirect::Policy::none())
        .build()?)
}

/// Shared by every request.
#[derive(Debug)]
pub struct AppState {
    pub runtime: ArcSwap<Runtime>,
    pub metrics: PrometheusHandle,
    pub shutting_down: std::sync::atomic::AtomicBool,
    /// Instances discovery found, merged into every runtime built.
    pub discovered: crate::fleet::discovery::Discovered,
    /// One runtime build at a time: a config reload and a discovery change
    /// must not publish over each other.
    rebuild: std::sync::Mutex<()>,
}

impl AppState {
    pub fn new(runtime: Runtime) -> Arc<Self> {
        // Installed by `Runtime::build`, before any series was recorded.
        let metrics = crate::telemetry::handle();
        Arc::new(Self {
            runtime: ArcSwap::from_pointee(runtime),
            metrics,
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            discovered: crate::fleet::discovery::Discovered::default(),
            rebuild: std::sync::Mutex::new(()),
        })
    }

    /// Validate-and-swap: build a new runtime from `config` and publish it
    /// atomically; then warm the instances it added (`routing.warmup`).
    pub fn reload(&self, mut config: Config) -> Result<(), ClientError> {
        let _one = self.rebuild.lock().unwrap_or_else(|e| e.into_inner());
        self.discovered.merge(&mut config);
        let current = self.runtime.load();
        let next = Arc::new(Runtime::build(config, Some(&current))?);
        self.runtime.store(Arc::clone(&next));
        for (name, inst) in &next.joined {
            let Some(ep) = next.endpoint(name) else {
                continue;
            };
            let Some(cfg) = ep.config.routing.warmup else {
                continue;
            };
            let hot = ep.hot.top(cfg.prefixes);
            let task = crate::fleet::warmup::warm(
                next.client.clone(),
                Arc::clone(inst),
                hot,
                cfg,
                ep.config.upstream_authorization.clone(),
            );
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn(task);
                }
                Err(_) => inst.set_warming(false),
            }
        }
        Ok(())
    }

    /// Rebuild from the running config, with discovery's current answers.
    pub fn republish(&self) {
        let config = Config::clone(&self.runtime.load().config);
        match self.reload(config) {
            Ok(()) => self.runtime.load().live.reloaded("discovery"),
            Err(e) => {
                tracing::error!(error = %e, "cannot rebuild the runtime after a discovery change")
            }
        }
    }
}
