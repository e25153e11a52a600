//! The blocks one instance holds, packed: a dense array of 16-byte blocks
//! (kvgate's key; the engine's hash, whose two top bits carry the tiers the
//! block is in) and two hash tables of 4-byte positions into it, one found by
//! engine hash (parents, removals), one by key (matching). A held block costs
//! 16 bytes plus 5 bytes a table bucket: 26 bytes at a full table, 36 just
//! after a table doubles (hashbrown keeps buckets at most 7/8 full).
//!
//! Removing a block moves the last one into its place (its two positions are
//! repointed), so the array never has holes.

use hashbrown::HashTable;

use super::EngineHash;

/// Tier bits in a block's `engine` field: its top two (engine hashes may be
/// small numbers, which differ in their low bits).
pub const GPU: u64 = 1 << 62;
pub const CPU: u64 = 1 << 63;
const TIERS: u64 = GPU | CPU;

/// A hash of a value that is a hash already: spread over the table's bits.
pub fn mix(x: u64) -> u64 {
    let x = x ^ (x >> 32);
    let x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 29)
}

/// The engine hash as stored: its two top bits give way to the tiers (an
/// engine-hash collision then needs 62 equal bits).
fn engine_id(h: EngineHash) -> u64 {
    h & !TIERS
}

#[derive(Debug, Clone, Copy)]
pub struct Block {
    pub key: u64,
    engine: u64,
}

impl Block {
    pub fn tiers(self) -> u64 {
        self.engine & TIERS
    }
}

#[derive(Debug, Default)]
pub struct Store {
    blocks: Vec<Block>,
    by_engine: HashTable<u32>,
    by_key: HashTable<u32>,
}

impl Store {
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
        self.by_engine.clear();
        self.by_key.clear();
    }

    /// The position of the block the engine calls `h`.
    pub fn find_engine(&self, h: EngineHash) -> Option<usize> {
        let id = engine_id(h);
        let blocks = &self.blocks;
        self.by_engine
            .find(mix(id), |&i| {
                blocks
                    .get(i as usize)
                    .is_some_and(|b| engine_id(b.engine) == id)
            })
            .map(|&i| i as usize)
    }

    /// The tiers `key` is held in (all blocks with that key together).
    pub fn tiers_of(&self, key: u64) -> u64 {
        let blocks = &self.blocks;
        let mut tiers = 0;
        for &i in self.by_key.iter_hash(mix(key)) {
            if let Some(b) = blocks.get(i as usize)
                && b.key == key
            {
                tiers |= b.tiers();
                if tiers & GPU != 0 {
                    break;
                }
            }
        }
        tiers
    }

    pub fn get(&self, at: usize) -> Option<Block> {
        self.blocks.get(at).copied()
    }

    /// A new block, untiered; its position. `None` past `u32` positions.
    pub fn push(&mut self, h: EngineHash, key: u64) -> Option<usize> {
        let at = u32::try_from(self.blocks.len()).ok()?;
        self.blocks.push(Block {
            key,
            engine: engine_id(h),
        });
        let blocks = &self.blocks;
        let engine_of = |&i: &u32| mix(blocks.get(i as usize).map_or(0, |b| engine_id(b.engine)));
        self.by_engine
            .insert_unique(mix(engine_id(h)), at, engine_of);
        let key_of = |&i: &u32| mix(blocks.get(i as usize).map_or(0, |b| b.key));
        self.by_key.insert_unique(mix(key), at, key_of);
        Some(at as usize)
    }

    /// Give the block at `at` another key (the engine reused its hash for
    /// other content), untiered.
    pub fn rekey(&mut self, at: usize, key: u64) {
        let Some(old) = self.get(at) else { return };
        unlink(&mut self.by_key, mix(old.key), at);
        if let Some(b) = self.blocks.get_mut(at) {
            b.key = key;
            b.engine = engine_id(b.engine);
        }
        let blocks = &self.blocks;
        let key_of = |&i: &u32| mix(blocks.get(i as usize).map_or(0, |b| b.key));
        self.by_key.insert_unique(mix(key), at as u32, key_of);
    }

    /// Set (`on`) or clear tier bits of the block at `at`; whether they changed.
    pub fn set_tier(&mut self, at: usize, tier: u64, on: bool) -> bool {
        let Some(b) = self.blocks.get_mut(at) else {
            return false;
        };
        let before = b.engine;
        if on {
            b.engine |= tier;
        } else {
            b.engine &= !tier;
        }
        before != b.engine
    }

    /// Remove the block at `at`; the last block takes its place.
    pub fn delete(&mut self, at: usize) {
        let Some(gone) = self.get(at) else { return };
        unlink(&mut self.by_engine, mix(engine_id(gone.engine)), at);
        unlink(&mut self.by_key, mix(gone.key), at);
        let last = self.blocks.len() - 1;
        if at != last
            && let Some(moved) = self.get(last)
        {
            repoint(&mut self.by_engine, mix(engine_id(moved.engine)), last, at);
            repoint(&mut self.by_key, mix(moved.key), last, at);
        }
        self.blocks.swap_remove(at);
    }
}

fn unlink(t: &mut HashTable<u32>, hash: u64, at: usize) {
    if let Ok(e) = t.find_entry(hash, |&i| i as usize == at) {
        e.remove();
    }
}

fn repoint(t: &mut HashTable<u32>, hash: u64, from: usize, to: usize) {
    if let Some(slot) = t.find_mut(hash, |&i| i as usize == from) {
        *slot = to as u32;
    }
}
