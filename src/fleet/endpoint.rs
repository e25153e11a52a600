//! One endpoint: a pool of instances serving the same models, its policy,
//! its KV-event subscriptions, fair queue and hottest prefixes; built from
//! config with the previous build's instances carried over (by id and URL),
//! and viewed per request as the loads and matched blocks a policy weighs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvgate_routing::held::TierWeights;
use kvgate_routing::held::fleet::FleetHeld;
use kvgate_routing::{self as routing, Load, Policy, PolicySpec};

use super::Instance;
use crate::config::EndpointConfig;
use crate::config::kv_aware::KvAwareConfig;
use crate::config::queue::QueueConfig;
use crate::kv_events::feed::FeedSettings;
use crate::kv_events::{Feed, Subscription, Trust};

/// One pool of instances serving the same models.
#[derive(Debug)]
pub struct Endpoint {
    pub config: EndpointConfig,
    pub instances: Vec<Arc<Instance>>,
    pub policy: Box<dyn Policy>,
    /// The shared KV tier's subscription (`kv_aware` with `shared_tier`).
    pub shared_tier: Option<Arc<Subscription>>,
    /// What every instance's KV events say it holds, in one index (kept
    /// across reloads, as the instances keep their feeds).
    pub held: Arc<FleetHeld>,
    /// Its hottest prefixes, for warming instances that join (kept across reloads).
    pub hot: Arc<crate::fleet::warmup::HotPrefixes>,
    /// Where each hinted session was last served (kept across reloads).
    pub sessions: Arc<crate::fleet::session_homes::SessionHomes>,
    /// Where its requests wait while every instance is saturated (kept across reloads).
    pub queue: Arc<crate::fleet::queue::FairQueue>,
    /// Its request counters and durations.
    pub series: Arc<crate::telemetry::EndpointSeries>,
    /// Its engines' tokens a character, learned from their answers (kept
    /// across reloads; see `kvgate_routing::units`).
    pub density: Arc<kvgate_routing::units::Density>,
    /// Engine tokens an index block stood for when the instances' indexes
    /// were last sized ([`Endpoint::follow_density`]).
    index_block_tokens: AtomicU64,
    /// Each instance's KV-event feed, by position, as `build` left it (an
    /// instance's feed changes only there). A view reads these instead of
    /// loading each instance's `ArcSwap`: a load and its release are locked
    /// instructions, full barriers on x86, and at 1,000 instances they
    /// kept the view's memory reads from overlapping (issue 31).
    feeds: Vec<Option<Arc<Feed>>>,
}

/// Size each instance's index for its capacity in tokens (learned where it
/// learns it, else configured) at `block_tokens` a block.
fn size_indexes(ec: &EndpointConfig, instances: &[Arc<Instance>], block_tokens: u64) {
    for (inst, ic) in instances.iter().zip(&ec.instances) {
        let learned = inst
            .learned_cache_tokens()
            .filter(|_| ic.learn_cache_tokens);
        inst.index.configure(
            ec.routing
                .index_blocks(learned.unwrap_or(ic.cache_tokens), block_tokens),
            ec.routing.block_chars,
        );
    }
}

/// Where one instance's matched blocks came from, for one request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Seen {
    /// Its KV-event feed's state; `None` when it has none.
    pub trust: Option<Trust>,
    /// The figures are from events (else the approximate index).
    pub from_events: bool,
    /// Leading blocks held in any tier, and on the GPU (events only).
    pub held_blocks: usize,
    pub gpu_blocks: usize,
}

impl Endpoint {
    /// Build from `ec`, keeping `old`'s instances, hot prefixes and queue;
    /// also the instances new to a running endpoint, to be warmed.
    pub fn build(
        ec: &EndpointConfig,
        old: Option<&Endpoint>,
        queue_config: &QueueConfig,
    ) -> (Arc<Self>, Vec<Arc<Instance>>) {
        let mut joined = Vec::new();
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
        let density = old.map_or_else(Arc::default, |o| Arc::clone(&o.density));
        let block_tokens = density.block_tokens(ec.routing.block_chars);
        size_indexes(ec, &instances, block_tokens);
        let ids: Vec<String> = ec.instances.iter().map(|i| i.id.clone()).collect();
        let policy = routing::build(&PolicySpec {
            strategy: ec.routing.strategy,
            ids: &ids,
            virtual_nodes: ec.routing.virtual_nodes,
            concurrency_threshold: ec.routing.concurrency_threshold,
            balance_factor: ec.routing.balance_factor,
            block_chars: ec.routing.block_chars,
            block_size: ec.routing.kv.as_ref().map_or(16, |k| k.block_size),
        });
        let kv = ec
            .routing
            .kv
            .as_ref()
            .filter(|_| ec.routing.strategy.uses_events());
        let held = old.map_or_else(Arc::default, |o| Arc::clone(&o.held));
        for (inst, ic) in instances.iter().zip(&ec.instances) {
            let settings = feed_settings(kv, ic.cache_tokens);
            let events = kv.and(ic.kv_events.as_deref());
            if kv.is_some() && events.is_none() {
                tracing::warn!(endpoint = %ec.name, instance = %ic.id, "kv_aware instance without kv_events: routed by the approximate index");
            }
            inst.follow_kv_events(events, ic.kv_replay.as_deref(), settings, &held);
        }
        let feeds = instances
            .iter()
            .map(|i| i.kv_feed().map(|s| Arc::clone(&s.feed)))
            .collect();
        let shared_tier = shared_tier(ec, old, &held);
        if ec.health.is_none() {
            // No active checks any more: nothing would ever bring an
            // instance a probe took out back (passive ejection cools down
            // by itself), so it starts healthy again.
            for inst in &instances {
                inst.set_healthy(true);
            }
        }
        let hot = old.map_or_else(Arc::default, |o| Arc::clone(&o.hot));
        let sessions = old.map_or_else(Arc::default, |o| Arc::clone(&o.sessions));
        let queue = old.map_or_else(
            || crate::fleet::queue::FairQueue::new(&ec.name),
            |o| Arc::clone(&o.queue),
        );
        let hook: std::sync::Weak<dyn crate::fleet::instance::Freed> = Arc::downgrade(&queue) as _;
        for inst in &instances {
            inst.notify_freed(std::sync::Weak::clone(&hook));
        }
        queue.configure(instances.clone(), queue_config.clone());
        // Instances new to a running endpoint are warmed before they serve.
        if let (Some(o), Some(_)) = (old, ec.routing.warmup) {
            for inst in &instances {
                if !o.instances.iter().any(|p| Arc::ptr_eq(p, inst)) {
                    inst.set_warming(true);
                    joined.push(Arc::clone(inst));
                }
            }
        }
        let ep = Arc::new(Self {
            series: crate::telemetry::EndpointSeries::of(&ec.name),
            config: ec.clone(),
            instances,
            policy,
            shared_tier,
            held,
            hot,
            sessions,
            queue,
            density,
            index_block_tokens: AtomicU64::new(block_tokens),
            feeds,
        });
        (ep, joined)
    }

    /// Resize every instance's index when the tokens a block stands for
    /// moved by more than an eighth since they were sized: a capacity
    /// learned in tokens holds that many more (or fewer) blocks of text
    /// denser (or sparser) than the guess. Without it, text at 7
    /// characters a token (real vLLM's cell) kept an index of 4/7 of what
    /// each engine held, so documents the engines still cached fell out of
    /// it and were placed again as cold.
    fn follow_density(&self) {
        let now = self.density.block_tokens(self.config.routing.block_chars);
        let sized = self.index_block_tokens.load(Ordering::Relaxed);
        if now.abs_diff(sized).saturating_mul(8) <= sized {
            return;
        }
        if self
            .index_block_tokens
            .compare_exchange(sized, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            size_indexes(&self.config, &self.instances, now);
            tracing::info!(endpoint = %self.name(), block_tokens = now,
                "the engines' tokens a character moved the index's block value; indexes resized");
        }
    }

    /// The tokens an index block stands for where the indexes were sized.
    pub fn index_block_tokens(&self) -> u64 {
        self.index_block_tokens.load(Ordering::Relaxed)
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Every instance's load for a request, and where its matched blocks
    /// came from. Index lookups happen only for strategies that use them.
    /// Under `kv_aware`, an instance whose events are live is looked up by
    /// the request's token keys; the others fall back to the approximate
    /// index, its blocks converted to engine blocks.
    pub fn view(&self, chain: &[u64], kv_keys: Option<&[u64]>) -> (Vec<Load>, Vec<Seen>) {
        let routing = &self.config.routing;
        let lookup = routing.strategy.uses_index() && !chain.is_empty();
        if lookup {
            self.follow_density();
        }
        let kv = routing
            .kv
            .as_ref()
            .filter(|_| routing.strategy.uses_events());
        let now = std::time::Instant::now();
        let now_ns = crate::kv_events::stamp(now);
        let now_ms = super::instance::now_ms();
        let shared: Option<&Feed> = self
            .shared_tier
            .as_deref()
            .map(|s| &*s.feed)
            .filter(|f| f.trust_at(now_ns).is_live());
        // One look at each instance's feed (its trust, its slot in the
        // fleet-wide index, the blocks it holds: atomics), then one walk of
        // the request's keys for the whole fleet.
        let feeds: Vec<FeedNow> = match kv {
            Some(_) => self
                .feeds
                .iter()
                .map(|f| self.feed_now(f.as_deref(), now, now_ns))
                .collect(),
            None => Vec::new(),
        };
        let w = TierWeights {
            cpu: kv.map_or(1.0, |k| k.cpu_weight),
            l2: kv.and_then(|k| k.shared.as_ref()).map_or(0.0, |t| t.weight),
        };
        let matches = match kv_keys {
            Some(prompt) if feeds.iter().any(|f| f.slot.is_some()) => {
                let shared = shared.and_then(|f| self.slot_of(f));
                self.held.matched_all(prompt, shared, w)
            }
            _ => Vec::new(),
        };
        let mut loads = Vec::with_capacity(self.instances.len());
        let mut seen = Vec::with_capacity(self.instances.len());
        // One look under an index's lock: the match, and how full it is.
        let approx = |inst: &Instance| {
            if lookup {
                inst.index.lookup(chain)
            } else {
                routing::Lookup::default()
            }
        };
        for (n, inst) in self.instances.iter().enumerate() {
            let (matched, fill, prefilling, s) = match kv {
                None => {
                    let l = approx(inst);
                    (l.matched, l.fill, l.prefilling, Seen::default())
                }
                Some(kv) => {
                    let f = feeds.get(n).copied().unwrap_or_default();
                    match f.slot.and_then(|s| matches.get(s as usize)) {
                        Some(held) => {
                            // Full as the engine's own events count it.
                            let cap = inst.index.capacity() * self.index_block_tokens() as usize;
                            let stored = f.held_blocks * kv.block_size;
                            let fill = routing::cost::fill(stored, cap);
                            let s = Seen {
                                trust: f.trust,
                                from_events: true,
                                held_blocks: held.blocks,
                                gpu_blocks: held.gpu_blocks,
                            };
                            let prefilling = held.expected_blocks > 0;
                            (held.weighted.floor() as usize, fill, prefilling, s)
                        }
                        // Events not live: the approximate index, looked up
                        // only here (its figures are not used beside events).
                        None => {
                            let l = approx(inst);
                            let tokens =
                                l.matched * self.density.block_tokens(routing.block_chars) as usize;
                            let s = Seen {
                                trust: f.trust,
                                ..Seen::default()
                            };
                            (tokens / kv.block_size.max(1), l.fill, l.prefilling, s)
                        }
                    }
                }
            };
            loads.push(Load {
                matched_blocks: matched,
                cache_fill: fill,
                prefilling,
                ..inst.load_at(now_ms)
            });
            seen.push(s);
        }
        (loads, seen)
    }
}

/// What a view reads of one instance's feed.
#[derive(Debug, Clone, Copy, Default)]
struct FeedNow {
    trust: Option<Trust>,
    /// Its slot in the fleet-wide index, when its events are live.
    slot: Option<u32>,
    held_blocks: usize,
}

impl Endpoint {
    /// An instance's feed as a view sees it at `now` (`now_ns` as
    /// [`crate::kv_events::stamp`] gives it); a live one's stale expected
    /// prompts are dropped first, as its own lookup did.
    fn feed_now(&self, feed: Option<&Feed>, now: std::time::Instant, now_ns: u64) -> FeedNow {
        let Some(feed) = feed else {
            return FeedNow::default();
        };
        let trust = feed.trust_at(now_ns);
        let live = trust.is_live();
        if live {
            feed.expire_due_at(now, now_ns);
        }
        FeedNow {
            trust: Some(trust),
            slot: self.slot_of(feed).filter(|_| live),
            held_blocks: feed.held_blocks(),
        }
    }

    /// A feed's slot in this endpoint's fleet-wide index.
    fn slot_of(&self, feed: &Feed) -> Option<u32> {
        feed.slot()
            .filter(|_| Arc::ptr_eq(feed.fleet(), &self.held))
    }
}

/// A feed's settings for an instance of `cache_tokens` (kv_aware; without
/// it the settings are never used). The block limit is generous over what the
/// instance can hold (CPU offload tiers are larger than the GPU's), but bounded.
fn feed_settings(kv: Option<&KvAwareConfig>, cache_tokens: usize) -> FeedSettings {
    let block_size = kv.map_or(16, |k| k.block_size.max(1));
    FeedSettings {
        silence: kv.map_or(std::time::Duration::ZERO, |k| k.silence),
        limit: (cache_tokens / block_size).saturating_mul(16).max(1 << 16),
        block_size,
    }
}

/// The endpoint's shared-tier subscription: the previous one when it follows
/// the same sockets, a new one otherwise.
fn shared_tier(
    ec: &EndpointConfig,
    old: Option<&Endpoint>,
    held: &Arc<FleetHeld>,
) -> Option<Arc<Subscription>> {
    let kv = ec
        .routing
        .kv
        .as_ref()
        .filter(|_| ec.routing.strategy.uses_events())?;
    let tier = kv.shared.as_ref()?;
    let kept = old.and_then(|o| o.shared_tier.clone()).filter(|s| {
        s.feed.events_url == tier.kv_events
            && s.feed.replay_url == tier.kv_replay
            && s.feed.block_size == kv.block_size
            && Arc::ptr_eq(s.feed.fleet(), held)
    });
    let settings = feed_settings(Some(kv), ec.routing.cache_tokens);
    if let Some(s) = &kept {
        s.feed.update(settings);
    }
    kept.or_else(|| {
        Subscription::start(Feed::new(
            (&ec.name, "shared_tier"),
            &tier.kv_events,
            tier.kv_replay.as_deref(),
            settings,
            held,
        ))
        .map(Arc::new)
    })
}
