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
//! weighs each block by its best tier. Pure and synchronous: an instance's
//! [`HeldIndex`] (its engine hashes, behind its feed's lock) records its
//! blocks in its endpoint's fleet-wide index ([`fleet::FleetHeld`]: each block
//! once, with its holders, in locked shards), which a request walks once for
//! every instance ([`fleet::FleetHeld::matched_all`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

#[path = "held_engines.rs"]
mod engines;
#[path = "held_fleet.rs"]
pub mod fleet;
#[path = "held_holders.rs"]
pub mod holders;
#[path = "held_index.rs"]
mod index;
#[path = "held_walk.rs"]
mod walk;
pub use index::HeldIndex;

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
        self.0 = engines::mix(x);
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
    // the same hash as feeding them one by one. Copied as 4-byte words: a
    // zip over 4-byte chunks of the buffer cost about 50 ns a block, most of
    // the keys of a 100k-token prompt (benches/kv_aware.rs).
    if tokens.len() <= STACK_TOKENS {
        let mut buf = [0u8; 8 + 4 * STACK_TOKENS];
        let (head, rest) = buf.split_at_mut(8);
        head.copy_from_slice(&parent.to_le_bytes());
        let words = &mut rest.as_chunks_mut::<4>().0[..tokens.len()];
        for (w, t) in words.iter_mut().zip(tokens) {
            *w = t.to_le_bytes();
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
    /// Of those, expected only: a prompt sent there is prefilling them now.
    pub expected_blocks: usize,
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

#[cfg(test)]
#[path = "held_fleet_tests.rs"]
mod fleet_tests;
#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
