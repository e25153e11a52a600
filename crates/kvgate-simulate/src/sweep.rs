//! The grid of settings (`prefix_aware` over `prefix_length` × `concurrency_threshold`,
//! `longest_prefix` over `block_chars` × the cache size the gateway assumes,
//! each other strategy once), run in parallel over one shared workload, and the
//! rule that picks the settings to recommend ([`recommend`], in `recommend.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Serialize, Serializer};

use kvgate_routing::{PolicySpec, Strategy, build, defaults};

use super::chain::{Chains, index_blocks};
use super::engine::{CacheAware, Routing, RunStats, run};
use super::instance::Timing;
use super::trace::TraceRequest;
use super::workload::{Workload, routing_keys};

/// The config's `prefix_length` default ([`defaults`]): `longest_prefix`
/// hashes that window onto the ring for its tie-breaks.
pub const DEFAULT_PREFIX_LENGTH: usize = defaults::DEFAULT_PREFIX_LENGTH as usize;

/// One point of the sweep. Strategies that ignore the prompt and the in-flight
/// threshold have none of the settings; `longest_prefix` has a threshold,
/// `block_chars` and `cache_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Setting {
    #[serde(serialize_with = "strategy_name")]
    pub strategy: Strategy,
    pub prefix_length: Option<usize>,
    pub concurrency_threshold: Option<usize>,
    /// Characters per index block.
    pub block_chars: Option<usize>,
    /// KV tokens per instance the gateway's index assumes (`routing.cache_tokens`).
    pub cache_tokens: Option<usize>,
}

impl Setting {
    /// A strategy run once, with no settings.
    pub fn plain(strategy: Strategy) -> Self {
        Self {
            strategy,
            prefix_length: None,
            concurrency_threshold: None,
            block_chars: None,
            cache_tokens: None,
        }
    }
}

fn strategy_name<S: Serializer>(s: &Strategy, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.as_str())
}

/// The values each swept strategy is run over.
#[derive(Debug, Clone, Default)]
pub struct Axes {
    /// `prefix_aware`.
    pub prefix_lengths: Vec<usize>,
    /// `prefix_aware`.
    pub thresholds: Vec<usize>,
    /// `longest_prefix`.
    pub block_chars: Vec<usize>,
    /// `longest_prefix`: the gateway's assumed KV tokens per instance.
    pub cache_tokens: Vec<usize>,
    /// `longest_prefix`'s one `concurrency_threshold`.
    pub longest_threshold: usize,
}

/// The fleet every setting runs on.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    pub instances: usize,
    pub timing: Timing,
    /// Arrival times are divided by this.
    pub speedup: f64,
    pub virtual_nodes: usize,
    pub balance_factor: Option<f64>,
    /// `longest_prefix`: most chain blocks per prompt (`routing.max_prompt_blocks`).
    pub max_prompt_blocks: usize,
}

impl Fleet {
    /// KV tokens each simulated instance really holds.
    pub fn cache_tokens(&self) -> usize {
        self.timing.cache_blocks * self.timing.block_size
    }
}

/// Every setting to run, in the order given (duplicate strategies once).
pub fn grid(strategies: &[Strategy], axes: &Axes) -> Vec<Setting> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for &strategy in strategies {
        if seen.contains(&strategy) {
            continue;
        }
        seen.push(strategy);
        match strategy {
            Strategy::PrefixAware => {
                for &p in &axes.prefix_lengths {
                    for &t in &axes.thresholds {
                        out.push(Setting {
                            prefix_length: Some(p),
                            concurrency_threshold: Some(t.max(1)),
                            ..Setting::plain(strategy)
                        });
                    }
                }
            }
            Strategy::LongestPrefix => {
                for &b in &axes.block_chars {
                    for &c in &axes.cache_tokens {
                        out.push(Setting {
                            concurrency_threshold: Some(axes.longest_threshold.max(1)),
                            block_chars: Some(b.max(1)),
                            cache_tokens: Some(c),
                            ..Setting::plain(strategy)
                        });
                    }
                }
            }
            _ => out.push(Setting::plain(strategy)),
        }
    }
    out
}

/// Run every setting on `threads` threads; results come back in `settings` order.
/// Cache-aware settings, the slowest, are started first.
pub fn sweep(
    trace: &[TraceRequest],
    w: &Workload,
    settings: &[Setting],
    fleet: &Fleet,
    threads: usize,
) -> anyhow::Result<Vec<RunStats>> {
    let mut keys: HashMap<usize, Vec<u64>> = HashMap::new();
    let mut chains: HashMap<usize, Chains> = HashMap::new();
    for s in settings {
        let window = match s.strategy {
            Strategy::PrefixAware => s.prefix_length,
            Strategy::LongestPrefix => Some(s.prefix_length.unwrap_or(DEFAULT_PREFIX_LENGTH)),
            _ => None,
        };
        if let Some(p) = window {
            keys.entry(p).or_insert_with(|| routing_keys(trace, p));
        }
        if let Some(b) = s.block_chars.filter(|_| s.strategy.uses_index()) {
            chains
                .entry(b)
                .or_insert_with(|| Chains::new(trace, b, fleet.max_prompt_blocks));
        }
    }
    let ids: Vec<String> = (0..fleet.instances.max(1))
        .map(|i| format!("instance-{i}"))
        .collect();
    let mut order: Vec<usize> = (0..settings.len()).collect();
    order.sort_by_key(|&i| !settings.get(i).is_some_and(|s| s.strategy.uses_index()));
    let next = AtomicUsize::new(0);
    let one = |i: usize, s: &Setting| {
        let block_chars = s.block_chars.unwrap_or(256);
        let policy = build(&PolicySpec {
            strategy: s.strategy,
            ids: &ids,
            virtual_nodes: fleet.virtual_nodes,
            concurrency_threshold: s.concurrency_threshold.unwrap_or(usize::MAX),
            // longest_prefix runs under its own config default, as live.
            balance_factor: if s.strategy.uses_index() {
                Some(defaults::DEFAULT_CACHE_AWARE_BALANCE_FACTOR)
            } else {
                fleet.balance_factor
            },
            block_chars,
            block_size: 16,
        });
        let window = match s.strategy {
            Strategy::LongestPrefix => Some(s.prefix_length.unwrap_or(DEFAULT_PREFIX_LENGTH)),
            _ => s.prefix_length,
        };
        let k = window.and_then(|p| keys.get(&p));
        let cache_aware = s
            .block_chars
            .and_then(|b| chains.get(&b))
            .filter(|_| s.strategy.uses_index())
            .map(|c| CacheAware {
                chains: c,
                index_blocks: index_blocks(
                    s.cache_tokens.unwrap_or_else(|| fleet.cache_tokens()),
                    c.block_chars,
                ),
            });
        let routing = Routing {
            policy: policy.as_ref(),
            keys: k.map_or(&[][..], Vec::as_slice),
            cache_aware,
        };
        let stats = run(w, routing, fleet.timing, ids.len(), fleet.speedup);
        (i, stats)
    };
    let workers = threads.clamp(1, settings.len().max(1));
    let mut done: Vec<(usize, RunStats)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let Some((i, s)) =
                            order.get(n).and_then(|&i| settings.get(i).map(|s| (i, s)))
                        else {
                            break;
                        };
                        mine.push(one(i, s));
                    }
                    mine
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?,
            );
        }
        Ok::<_, anyhow::Error>(all)
    })?;
    done.sort_by_key(|(i, _)| *i);
    Ok(done.into_iter().map(|(_, s)| s).collect())
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
