//! Everything derived from config, swapped as one: endpoints with their
//! instances and policies, model and name lookups, and the upstream client.
//! A request loads the [`Runtime`] once and sees the old world or the new one,
//! never a mix. Instances are carried over by (endpoint, id) so in-flight
//! counts survive a reload.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::{Config, EndpointConfig};
use crate::routing::{self, Load, Policy, PolicySpec};
use crate::upstream::Instance;

/// One pool of instances serving the same models.
#[derive(Debug)]
pub struct Endpoint {
    pub config: EndpointConfig,
    pub instances: Vec<Arc<Instance>>,
    pub policy: Box<dyn Policy>,
}

impl Endpoint {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Every instance's load for a request with this block chain; the index
    /// lookups happen only for strategies that use them.
    pub fn loads(&self, chain: &[u64]) -> Vec<Load> {
        let lookup = self.config.routing.strategy.uses_index() && !chain.is_empty();
        self.instances
            .iter()
            .map(|i| Load {
                matched_blocks: if lookup { i.index.matched(chain) } else { 0 },
                ..i.load()
            })
            .collect()
    }
}

#[derive(Debug)]
pub struct Runtime {
    pub config: Arc<Config>,
    pub endpoints: Vec<Arc<Endpoint>>,
    by_model: HashMap<String, Arc<Endpoint>>,
    by_name: HashMap<String, Arc<Endpoint>>,
    pub client: reqwest::Client,
    /// Authentication, tenant limits and salts; counters carried across reloads.
    pub tenancy: Arc<crate::tenancy::Tenancy>,
}

impl Runtime {
    /// Build from a validated config, reusing `previous`'s instances where
    /// endpoint name and instance id match.
    pub fn build(config: Config, previous: Option<&Runtime>) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.server.timeouts.connect)
            .tcp_nodelay(true)
            // Below the keep-alive of uvicorn (vLLM, SGLang) and llama-server,
            // 5 s: reusing a connection the server has just closed would fail
            // the request over and cool a healthy instance down.
            .pool_idle_timeout(std::time::Duration::from_secs(4))
            .pool_max_idle_per_host(1024)
            .no_proxy()
            .build()?;
        let mut endpoints = Vec::with_capacity(config.endpoints.len());
        let mut by_model = HashMap::new();
        let mut by_name = HashMap::new();
        for ec in &config.endpoints {
            let old = previous.and_then(|p| p.endpoint(&ec.name));
            let instances: Vec<Arc<Instance>> = ec
                .instances
                .iter()
                .map(|ic| {
                    old.and_then(|o| {
                        o.instances
                            .iter()
                            .find(|i| i.id == ic.id && i.url == ic.url)
                    })
                    .cloned()
                    .unwrap_or_else(|| Instance::new(&ec.name, &ic.id, &ic.url))
                })
                .collect();
            // Kept instances keep what they hold; a changed block size or
            // capacity is applied to their index (see BlockIndex::configure).
            for (inst, ic) in instances.iter().zip(&ec.instances) {
                let learned = inst
                    .learned_cache_tokens()
                    .filter(|_| ic.learn_cache_tokens);
                inst.index.configure(
                    ec.routing.index_blocks(learned.unwrap_or(ic.cache_tokens)),
                    ec.routing.block_chars,
                );
            }
            let ids: Vec<String> = ec.instances.iter().map(|i| i.id.clone()).collect();
            let policy = routing::build(&PolicySpec {
                strategy: ec.routing.strategy,
                ids: &ids,
                virtual_nodes: ec.routing.virtual_nodes,
                concurrency_threshold: ec.routing.concurrency_threshold,
                balance_factor: ec.routing.balance_factor,
                block_chars: ec.routing.block_chars,
            });
            let ep = Arc::new(Endpoint {
                config: ec.clone(),
                instances,
                policy,
            });
            for m in &ec.models {
                by_model.insert(m.clone(), Arc::clone(&ep));
            }
            by_name.insert(ec.name.clone(), Arc::clone(&ep));
            endpoints.push(ep);
        }
        let tenancy =
            crate::tenancy::Tenancy::build(&config.tenancy, previous.map(|p| &*p.tenancy));
        Ok(Self {
            config: Arc::new(config),
            endpoints,
            by_model,
            by_name,
            client,
            tenancy: Arc::new(tenancy),
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

/// Shared by every request.
#[derive(Debug)]
pub struct AppState {
    pub runtime: ArcSwap<Runtime>,
    pub metrics: PrometheusHandle,
    pub shutting_down: std::sync::atomic::AtomicBool,
}

impl AppState {
    pub fn new(runtime: Runtime) -> Arc<Self> {
        Arc::new(Self {
            runtime: ArcSwap::from_pointee(runtime),
            metrics: crate::telemetry::handle(),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Validate-and-swap: build a new runtime from `config` and publish it atomically.
    pub fn reload(&self, config: Config) -> Result<(), reqwest::Error> {
        let current = self.runtime.load();
        let next = Runtime::build(config, Some(&current))?;
        self.runtime.store(Arc::new(next));
        Ok(())
    }
}
