//! The held blocks of a whole endpoint in one index (as Dynamo's KV indexer
//! and SGLang's router keep them): kvgate's block key → the instances holding
//! it, with their tiers ([`super::holders`]), so that a decision walks a
//! request's keys once for the fleet ([`FleetHeld::matched_all`]) and a block
//! every engine holds (a shared system prompt) is stored once.
//!
//! Each instance joins with a slot (a small integer, reused after it leaves;
//! a kept instance keeps its slot across reloads because it keeps its feed).
//! The instance keeps, for its removals and parent lookups, only its engine
//! hashes and the position of each block's entry here (see `HeldIndex`).
//!
//! Bytes a held block: an entry of 16 bytes and a 5-byte bucket of the key
//! table, once however many instances hold it, plus 4 bytes a holder beyond
//! the first; and in each holding instance an engine-hash entry of 12 bytes
//! plus a control byte. With hashbrown's tables full (7/8) that is 16 +
//! 5.7 + 14.9 ≈ 37 B a block held by one instance and 4 + 14.9 ≈ 19 B a
//! holder of a block many hold; a table that has just doubled is half full,
//! which doubles its share (the measured figures are in
//! bench/results/kv-ingest.md).
//!
//! Concurrency: 64 shards by key, each behind its own `RwLock`. A writer (an
//! instance's subscriber, or a dispatch marking blocks expected) takes one
//! shard's write lock for one block's change at a time, so a reader waits at
//! most for one block's change in one shard; a reader takes one shard's read
//! lock for one key at a time and copies its holders out, so readers never
//! wait for each other nor hold two locks. A walk is therefore not a snapshot
//! of the fleet: a batch applied during it may be seen in part, which is no
//! worse than the per-instance locks it replaces (each instance was looked at
//! at a different moment).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::holders::{MAX_SLOTS, Shard};
use super::{Held, TierWeights};

const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;
const POS_BITS: u32 = 32 - SHARD_BITS;

/// Where a block's entry is: its shard and its place in it.
pub type Pos = u32;

fn shard_of(key: u64) -> usize {
    // Another multiplier than the tables' own hash, so a shard's keys still
    // spread over its table.
    (key.wrapping_mul(0xd6e8_feb8_6659_fd93) >> (64 - SHARD_BITS)) as usize
}

fn split(pos: Pos) -> (usize, u32) {
    ((pos >> POS_BITS) as usize, pos & ((1 << POS_BITS) - 1))
}

#[derive(Debug, Default)]
struct Slots {
    next: u32,
    free: Vec<u32>,
}

#[derive(Debug)]
pub struct FleetHeld {
    shards: Box<[RwLock<Shard>]>,
    slots: Mutex<Slots>,
    /// One more than the highest slot ever given (results are by slot).
    high: AtomicUsize,
}

impl Default for FleetHeld {
    fn default() -> Self {
        Self::new()
    }
}

impl FleetHeld {
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            slots: Mutex::default(),
            high: AtomicUsize::new(0),
        }
    }

    fn read(&self, i: usize) -> Option<RwLockReadGuard<'_, Shard>> {
        // A panic under a lock cannot leave a shard inconsistent in a way
        // that matters for routing; keep serving.
        let s = self.shards.get(i)?;
        Some(s.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn write(&self, i: usize) -> Option<RwLockWriteGuard<'_, Shard>> {
        let s = self.shards.get(i)?;
        Some(s.write().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// A slot for a new instance; `None` past [`MAX_SLOTS`].
    pub fn join(&self) -> Option<u32> {
        let mut s = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = match s.free.pop() {
            Some(slot) => slot,
            None if s.next < MAX_SLOTS => {
                s.next += 1;
                s.next - 1
            }
            None => return None,
        };
        self.high.fetch_max(slot as usize + 1, Ordering::Relaxed);
        Some(slot)
    }

    /// Give `slot` back; the instance must have released its holdings.
    pub fn leave(&self, slot: u32) {
        let mut s = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot < s.next && !s.free.contains(&slot) {
            s.free.push(slot);
        }
    }

    /// One more than the highest slot given: the length of a walk's result.
    pub fn slots(&self) -> usize {
        self.high.load(Ordering::Relaxed)
    }

    /// Distinct blocks held by some instance.
    pub fn len(&self) -> usize {
        (0..SHARDS)
            .filter_map(|i| self.read(i))
            .map(|s| s.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Set `slot`'s record for `key` to `f(record)`, making the entry if
    /// needed; the entry's position and the new record.
    pub fn upsert(&self, key: u64, slot: u32, f: impl FnOnce(u32) -> u32) -> Option<(Pos, u32)> {
        let i = shard_of(key);
        let (at, r) = self.write(i)?.upsert(key, slot, f, 1 << POS_BITS)?;
        Some(((i as u32) << POS_BITS | at, r))
    }

    /// Set `slot`'s record at `pos` to `f(record)`; the new record.
    pub fn update(&self, pos: Pos, slot: u32, f: impl FnOnce(u32) -> u32) -> u32 {
        let (i, at) = split(pos);
        self.write(i).map_or(0, |mut s| s.update(at, slot, f))
    }

    /// [`FleetHeld::update`] by key, for a key that has an entry.
    pub fn update_key(&self, key: u64, slot: u32, f: impl FnOnce(u32) -> u32) -> u32 {
        let Some(mut s) = self.write(shard_of(key)) else {
            return 0;
        };
        match s.find(key) {
            Some(at) => s.update(at, slot, f),
            None => 0,
        }
    }

    pub fn key_at(&self, pos: Pos) -> Option<u64> {
        let (i, at) = split(pos);
        self.read(i)?.key_at(at)
    }

    /// `slot`'s record for `key` (0: it holds nothing of it).
    pub fn record(&self, key: u64, slot: u32) -> u32 {
        self.read(shard_of(key))
            .and_then(|s| s.find(key).map(|at| s.record(at, slot)))
            .unwrap_or(0)
    }

    /// Drop `slot` from the entries at `positions` (sorted here, so that each
    /// shard is taken once).
    pub fn release(&self, slot: u32, positions: &mut [Pos]) {
        positions.sort_unstable();
        for run in positions.chunk_by(|a, b| split(*a).0 == split(*b).0) {
            let Some(&first) = run.first() else { continue };
            let Some(mut s) = self.write(split(first).0) else {
                continue;
            };
            for &p in run {
                s.update(split(p).1, slot, |_| 0);
            }
        }
    }

    /// How much of `keys` every slot's instance holds, by slot, with the
    /// shared tier's slot `shared` filling blocks an instance lacks.
    pub fn matched_all(&self, keys: &[u64], shared: Option<u32>, w: TierWeights) -> Vec<Held> {
        super::walk::walk(keys, self.slots(), shared, w, |k, out| {
            match self.read(shard_of(k)) {
                Some(s) => s.holders_of(k, out),
                None => out.clear(),
            }
        })
    }
}
