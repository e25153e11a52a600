//! What an instance really holds, learned from its KV events (`kv_aware`):
//! blocks keyed by kvgate's own hash of their token ids, so the engine's hash
//! function, seed and encoding never matter.
//!
//! A block's key chains its parent's: `key(b) = xxh3(key(parent) ‖ token ids
//! of b)`, and a prompt's first block starts from a seed of the engine-visible
//! `cache_salt` ([`seed`]). A request computes the same keys from its own
//! tokens ([`token_keys`]), so a lookup is a walk down the request's chain
//! while the instance holds each block ([`HeldIndex::matched`]). The engine
//! reports a block by its own hash and its parent by the parent's engine hash;
//! the index maps engine hashes to keys to resolve both, and to apply removals.
//!
//! A salt is part of the key because it is part of the engine's: a block stored
//! for one tenant is useless to another, and a stored block only ever counts
//! for requests whose salt produced it. Where the event does not say which salt
//! (vLLM before `extra_keys` in BlockStored), the caller attributes the prompt's
//! first block from the requests it sent ([`root_content_key`]); a block it
//! cannot attribute counts as unsalted, which no salted request ever matches.
//!
//! Tiers: a block may be held on the GPU, offloaded to CPU, or both; a match
//! weighs each block by its best tier. Pure and synchronous; the subscriber
//! holds it behind a lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

#[path = "held_fleet.rs"]
pub mod fleet;
#[path = "held_holders.rs"]
pub mod holders;
#[path = "held_store.rs"]
mod store;
#[path = "held_walk.rs"]
mod walk;
use store::{CPU, GPU, Store};

/// A hasher for keys that are hashes already (kvgate's xxh3 keys, engine
/// block hashes): one multiply and two shifts spread any bits of the key
/// over the table's index and tag bits. Seedless: engines are trusted and
/// the keys are not chosen by clients.
#[derive(Debug, Default, Clone, Copy)]
pub struct Mixed(u64);

impl Hasher for Mixed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(self.0 ^ u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = store::mix(x);
    }
}

/// A map keyed by a hash.
pub type HashKeyed<V> = HashMap<u64, V, BuildHasherDefault<Mixed>>;

/// A block hash as the engine reported it, folded to 64 bits.
pub type EngineHash = u64;

/// Where a block lives: on the GPU, or offloaded (vLLM's CPU offload, LMCache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    Gpu,
    Cpu,
}

const SEED_DOMAIN: u64 = 0x6b76_6761_7465_6b76; // "kvgatekv"
const CONTENT_DOMAIN: u64 = 0x636f_6e74_656e_7421; // "content!"

/// Whose blocks these are: the engine-visible `cache_salt` (the engine keeps
/// salts apart) and the gateway's partition (`prompt_cache_key`,
/// `X-Amzn-SageMaker-Prefix-Aware-Id`), which scopes matching as it scopes
/// `longest_prefix`'s chains. The default is unsalted and unpartitioned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    pub salt: Option<String>,
    pub partition: String,
}

impl Scope {
    pub fn is_default(&self) -> bool {
        self.salt.is_none() && self.partition.is_empty()
    }

    /// The chain seed of a prompt in this scope.
    pub fn seed(&self) -> u64 {
        if self.is_default() {
            return SEED_DOMAIN;
        }
        let mut h = Xxh3::with_seed(SEED_DOMAIN);
        if let Some(s) = &self.salt {
            h.update(&(s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        h.update(&[0xff]);
        h.update(self.partition.as_bytes());
        h.digest() ^ 1
    }
}

/// The chain seed of a prompt the engine saw with `salt`, unpartitioned.
pub fn seed(salt: Option<&str>) -> u64 {
    Scope {
        salt: salt.map(str::to_owned),
        partition: String::new(),
    }
    .seed()
}

/// Tokens a block may have for its key to be hashed from the stack.
const STACK_TOKENS: usize = 64;

fn chain(parent: u64, tokens: &[u32]) -> u64 {
    // One call over `parent ‖ tokens` (little-endian), the same bytes and so
    // the same hash as feeding them one by one.
    if tokens.len() <= STACK_TOKENS {
        let mut buf = [0u8; 8 + 4 * STACK_TOKENS];
        buf[..8].copy_from_slice(&parent.to_le_bytes());
        for (dst, t) in buf[8..].chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        return xxh3_64(&buf[..8 + 4 * tokens.len()]);
    }
    let mut h = Xxh3::new();
    h.update(&parent.to_le_bytes());
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.digest()
}

/// Keys of the full `block_size`-token blocks of `ids`, at most `max_blocks`.
pub fn token_keys(seed: u64, ids: &[u32], block_size: usize, max_blocks: usize) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut parent = seed;
    ids.chunks_exact(block_size)
        .take(max_blocks)
        .map(|b| {
            parent = chain(parent, b);
            parent
        })
        .collect()
}

/// A salt-blind key of a prompt's first block, to attribute a root block whose
/// event does not report its salt to the request that produced it.
pub fn root_content_key(first_block: &[u32]) -> u64 {
    chain(CONTENT_DOMAIN, first_block)
}

/// Weights of the tiers in a match: a GPU block counts 1, an offloaded one
/// `cpu` (it must be copied back first), a block only in the shared L2 tier `l2`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierWeights {
    pub cpu: f64,
    pub l2: f64,
}

/// How much of a request's chain an instance holds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Held {
    /// Leading blocks held in some tier.
    pub blocks: usize,
    /// Of those, held on the GPU.
    pub gpu_blocks: usize,
    /// `blocks`, each weighed by its best tier.
    pub weighted: f64,
}

/// The outcome of applying one stored event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    pub stored: usize,
    /// Blocks that could not be keyed: parent unknown, LoRA, bad block size.
    pub dropped: usize,
    /// Of those, blocks whose parent the index never saw (it missed history).
    pub orphaned: usize,
}

#[derive(Debug, Default)]
pub struct HeldIndex {
    /// The blocks held, by engine hash and by key (see `held_store`).
    store: Store,
    /// Blocks of prompts sent to the instance whose events have not come yet
    /// (prefill in progress), by how many such prompts carry each: counted
    /// as held so a second request for a prefix being prefilled follows the
    /// first instead of prefilling it again elsewhere. A block leaves when
    /// its BlockStored arrives (from then on events are the truth) or when
    /// the caller gives the prompt up ([`HeldIndex::unexpect`]).
    expected: HashKeyed<u32>,
    /// Most engine hashes kept; stores beyond it are dropped (a publisher
    /// whose removals are lost must not grow the gateway without bound).
    limit: usize,
}

impl HeldIndex {
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// A new bound on engine hashes kept; blocks already held stay (the
    /// engine's removals shrink the index).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
    }

    pub fn is_empty(&self) -> bool {
        self.store.len() == 0
    }

    pub fn clear(&mut self) {
        self.store.clear();
        self.expected.clear();
    }

    /// A prompt with these keys was sent to the instance.
    pub fn expect(&mut self, keys: &[u64]) {
        for k in keys {
            if self.store.tiers_of(*k) == 0 {
                *self.expected.entry(*k).or_default() += 1;
            }
        }
    }

    /// Give up expecting a prompt's keys (its events should have come by now,
    /// or it was refused).
    pub fn unexpect(&mut self, keys: &[u64]) {
        for k in keys {
            if let Some(n) = self.expected.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.expected.remove(k);
                }
            }
        }
    }

    /// Blocks expected and not yet reported.
    pub fn expected_len(&self) -> usize {
        self.expected.len()
    }

    /// The key of the block the engine calls `hash`, if known.
    pub fn key_of(&self, hash: EngineHash) -> Option<u64> {
        let at = self.store.find_engine(hash)?;
        self.store.get(at).map(|b| b.key)
    }

    /// Apply a BlockStored: `root_seed` is the chain seed for a first block
    /// (`parent` = None); blocks after an unknown parent are dropped.
    pub fn store(
        &mut self,
        hashes: &[EngineHash],
        parent: Option<EngineHash>,
        token_ids: &[u32],
        block_size: usize,
        medium: Medium,
        root_seed: u64,
    ) -> Applied {
        let mut prev = match parent {
            None => root_seed,
            Some(p) => match self.key_of(p) {
                Some(k) => k,
                None => {
                    return Applied {
                        stored: 0,
                        dropped: hashes.len(),
                        orphaned: hashes.len(),
                    };
                }
            },
        };
        if block_size == 0 || token_ids.len() < hashes.len() * block_size {
            return Applied {
                stored: 0,
                dropped: hashes.len(),
                orphaned: 0,
            };
        }
        let mut applied = Applied::default();
        let tier = match medium {
            Medium::Gpu => GPU,
            Medium::Cpu => CPU,
        };
        for (i, &h) in hashes.iter().enumerate() {
            let key = chain(prev, &token_ids[i * block_size..(i + 1) * block_size]);
            prev = key;
            let at = match self.store.find_engine(h) {
                Some(at) => {
                    if self.store.get(at).is_some_and(|b| b.key != key) {
                        // The engine reused a hash for other content (it
                        // re-hashed after a restart we missed): forget the old block.
                        self.store.rekey(at, key);
                    }
                    at
                }
                None if self.store.len() >= self.limit => {
                    applied.dropped += 1;
                    continue;
                }
                None => match self.store.push(h, key) {
                    Some(at) => at,
                    None => {
                        applied.dropped += 1;
                        continue;
                    }
                },
            };
            if !self.expected.is_empty() {
                self.expected.remove(&key);
            }
            self.store.set_tier(at, tier, true);
            applied.stored += 1;
        }
        applied
    }

    /// Apply a BlockRemoved for `medium`. Returns the blocks removed.
    pub fn remove(&mut self, hashes: &[EngineHash], medium: Medium) -> usize {
        let tier = match medium {
            Medium::Gpu => GPU,
            Medium::Cpu => CPU,
        };
        let mut removed = 0;
        for &h in hashes {
            let Some(at) = self.store.find_engine(h) else {
                continue;
            };
            if self.store.set_tier(at, tier, false) {
                removed += 1;
            }
            if self.store.get(at).is_some_and(|b| b.tiers() == 0) {
                self.store.delete(at);
            }
        }
        removed
    }

    /// The tier a block is held in, best first.
    fn tier(&self, key: u64) -> Option<Medium> {
        match self.store.tiers_of(key) {
            0 => None,
            t if t & GPU != 0 => Some(Medium::Gpu),
            _ => Some(Medium::Cpu),
        }
    }

    /// How much of `keys` this instance holds, with `shared` (the L2 tier
    /// every instance reaches) filling blocks it lacks.
    pub fn matched(&self, keys: &[u64], shared: Option<&HeldIndex>, w: TierWeights) -> Held {
        let mut out = Held::default();
        for &k in keys {
            let weight = match self.tier(k) {
                Some(Medium::Gpu) => {
                    out.gpu_blocks += 1;
                    1.0
                }
                Some(Medium::Cpu) => w.cpu,
                // Being prefilled there now: on the GPU by the time it matters.
                None if self.expected.contains_key(&k) => 1.0,
                None if shared.is_some_and(|s| s.store.tiers_of(k) != 0) => w.l2,
                None => break,
            };
            out.blocks += 1;
            out.weighted += weight;
        }
        out
    }
}

#[cfg(test)]
#[path = "held_fleet_tests.rs"]
mod fleet_tests;
#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
