//! One instance's part of its endpoint's fleet-wide index: what its engine
//! reported, by engine hash (to resolve parents and apply removals), and the
//! blocks of prompts sent to it and not yet reported. The blocks themselves,
//! with their tiers, are recorded in the [`FleetHeld`] it joined, under the
//! instance's slot; dropping the index releases them and the slot.

use std::sync::Arc;

use super::engines::{Engines, engine_id};
use super::fleet::{FleetHeld, Pos};
use super::holders::{CPU, EXPECTED, GPU, REF, refs};
use super::{Applied, EngineHash, HashKeyed, Held, Medium, TierWeights, chain};

const STORED: u32 = GPU | CPU;

fn tier(medium: Medium) -> u32 {
    match medium {
        Medium::Gpu => GPU,
        Medium::Cpu => CPU,
    }
}

/// One more engine block of the instance carries the record's key, in `t`.
fn attach(r: u32, t: u32) -> u32 {
    let r = if refs(r) < 31 { r + REF } else { r };
    (r | t) & !EXPECTED
}

/// One engine block fewer carries it. With others left, their tiers are not
/// known here: the record keeps the union (a key reported under two engine
/// hashes by one instance is rare: an engine reusing content under new
/// extra keys).
fn detach(r: u32) -> u32 {
    if refs(r) <= 1 { 0 } else { r - REF }
}

/// Engine hashes looked up at once, ahead of their blocks' changes.
const AHEAD: usize = 16;

/// An event's engine-table lookups, [`AHEAD`] at a time before the changes
/// they lead to: each change takes a shard's lock, a locked instruction and
/// so a full barrier on x86, which kept every lookup's cache miss waiting
/// for the last (a fifth of ingestion's CPU was these lookups).
#[derive(Default)]
struct Ahead {
    found: [Option<(u32, Pos)>; AHEAD],
}

impl Ahead {
    /// What `engines` holds for `hashes[i]` now, given that the blocks
    /// before `i` have been applied.
    fn find(&mut self, engines: &Engines, hashes: &[EngineHash], i: usize) -> Option<(u32, Pos)> {
        let start = i - i % AHEAD;
        let chunk = hashes
            .get(start..hashes.len().min(start + AHEAD))
            .unwrap_or(&[]);
        if i == start {
            for (f, &h) in self.found.iter_mut().zip(chunk) {
                *f = engines.find(h);
            }
        }
        let j = i - start;
        match chunk.get(j) {
            // A hash the table takes for one seen earlier in the chunk was
            // changed since the look ahead: look again.
            Some(&h)
                if chunk
                    .get(..j)
                    .is_some_and(|c| c.iter().any(|&e| engine_id(e) == engine_id(h))) =>
            {
                engines.find(h)
            }
            Some(_) => self.found.get(j).copied().flatten(),
            None => None,
        }
    }
}

#[derive(Debug)]
pub struct HeldIndex {
    fleet: Arc<FleetHeld>,
    /// `None`: the fleet had no slot left, and nothing is recorded.
    slot: Option<u32>,
    engines: Engines,
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
    /// An index alone in its own fleet.
    pub fn new(limit: usize) -> Self {
        Self::join(&Arc::new(FleetHeld::new()), limit)
    }

    /// An instance's index recording into `fleet`.
    pub fn join(fleet: &Arc<FleetHeld>, limit: usize) -> Self {
        Self {
            fleet: Arc::clone(fleet),
            slot: fleet.join(),
            engines: Engines::default(),
            expected: HashKeyed::default(),
            limit: limit.max(1),
        }
    }

    pub fn fleet(&self) -> &Arc<FleetHeld> {
        &self.fleet
    }

    /// The instance's slot in the fleet's walks.
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// A new bound on engine hashes kept; blocks already held stay (the
    /// engine's removals shrink the index).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
    }

    pub fn is_empty(&self) -> bool {
        self.engines.len() == 0
    }

    /// Forget everything: this instance's holdings leave the fleet's index.
    pub fn clear(&mut self) {
        if let Some(slot) = self.slot {
            self.fleet.release(slot, &mut self.engines.positions());
            for &k in self.expected.keys() {
                self.fleet.update_key(k, slot, |r| r & !EXPECTED);
            }
        }
        self.engines.clear();
        self.expected.clear();
    }

    /// A prompt with these keys was sent to the instance.
    pub fn expect(&mut self, keys: &[u64]) {
        let Some(slot) = self.slot else { return };
        for &k in keys {
            let mut added = false;
            self.fleet.upsert(k, slot, |r| {
                if r & STORED != 0 {
                    return r;
                }
                added = true;
                r | EXPECTED
            });
            if added {
                *self.expected.entry(k).or_default() += 1;
            }
        }
    }

    /// Give up expecting a prompt's keys (its events should have come by now,
    /// or it was refused).
    pub fn unexpect(&mut self, keys: &[u64]) {
        let Some(slot) = self.slot else { return };
        for k in keys {
            if let Some(n) = self.expected.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.expected.remove(k);
                    self.fleet.update_key(*k, slot, |r| r & !EXPECTED);
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
        let (_, pos) = self.engines.find(hash)?;
        self.fleet.key_at(pos)
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
        let refused = |orphaned| Applied {
            stored: 0,
            dropped: hashes.len(),
            orphaned,
        };
        let Some(slot) = self.slot else {
            return refused(0);
        };
        let mut prev = match parent {
            None => root_seed,
            Some(p) => match self.key_of(p) {
                Some(k) => k,
                None => return refused(hashes.len()),
            },
        };
        if block_size == 0 || token_ids.len() < hashes.len() * block_size {
            return refused(0);
        }
        let mut applied = Applied::default();
        let t = tier(medium);
        let mut ahead = Ahead::default();
        for (i, &h) in hashes.iter().enumerate() {
            let key = chain(prev, &token_ids[i * block_size..(i + 1) * block_size]);
            prev = key;
            let known = ahead.find(&self.engines, hashes, i);
            let same = known.filter(|&(_, pos)| self.fleet.key_at(pos) == Some(key));
            match (known, same) {
                (_, Some((tiers, pos))) => {
                    self.fleet.update(pos, slot, |r| (r | t) & !EXPECTED);
                    if tiers & t == 0 {
                        self.engines.set(h, tiers | t, pos);
                    }
                }
                (None, None) if self.engines.len() >= self.limit => {
                    applied.dropped += 1;
                    continue;
                }
                (known, None) => {
                    if let Some((_, old)) = known {
                        // The engine reused a hash for other content (it
                        // re-hashed after a restart we missed): forget the old block.
                        self.fleet.update(old, slot, detach);
                    }
                    match self.fleet.upsert(key, slot, |r| attach(r, t)) {
                        Some((pos, _)) if known.is_none() => self.engines.insert_new(h, t, pos),
                        Some((pos, _)) => self.engines.set(h, t, pos),
                        None => {
                            self.engines.remove(h);
                            applied.dropped += 1;
                            continue;
                        }
                    }
                }
            }
            if !self.expected.is_empty() {
                self.expected.remove(&key);
            }
            applied.stored += 1;
        }
        applied
    }

    /// Apply a BlockRemoved for `medium`. Returns the blocks removed.
    pub fn remove(&mut self, hashes: &[EngineHash], medium: Medium) -> usize {
        let Some(slot) = self.slot else { return 0 };
        let t = tier(medium);
        let mut removed = 0;
        let mut ahead = Ahead::default();
        for (i, &h) in hashes.iter().enumerate() {
            let Some((tiers, pos)) = ahead.find(&self.engines, hashes, i) else {
                continue;
            };
            if tiers & t != 0 {
                removed += 1;
            }
            let left = tiers & !t;
            if left == 0 {
                self.engines.remove(h);
                self.fleet.update(pos, slot, detach);
            } else {
                self.engines.set(h, left, pos);
                self.fleet.update(pos, slot, |r| {
                    if refs(r) <= 1 {
                        (r & !STORED) | left
                    } else {
                        r
                    }
                });
            }
        }
        removed
    }

    /// This instance's record of `key` (0: nothing).
    fn record(&self, key: u64) -> u32 {
        self.slot.map_or(0, |s| self.fleet.record(key, s))
    }

    /// How much of `keys` this instance alone holds, with `shared` (the L2
    /// tier every instance reaches) filling blocks it lacks. A decision for
    /// the whole fleet walks once instead ([`FleetHeld::matched_all`]).
    pub fn matched(&self, keys: &[u64], shared: Option<&HeldIndex>, w: TierWeights) -> Held {
        let mut out = Held::default();
        for &k in keys {
            let r = self.record(k);
            let weight = if r & GPU != 0 {
                out.gpu_blocks += 1;
                1.0
            } else if r & CPU != 0 {
                w.cpu
            } else if r & EXPECTED != 0 {
                // Being prefilled there now: on the GPU by the time it matters.
                out.expected_blocks += 1;
                1.0
            } else if shared.is_some_and(|s| s.record(k) & STORED != 0) {
                w.l2
            } else {
                break;
            };
            out.blocks += 1;
            out.weighted += weight;
        }
        out
    }
}

impl Drop for HeldIndex {
    fn drop(&mut self) {
        self.clear();
        if let Some(slot) = self.slot {
            self.fleet.leave(slot);
        }
    }
}
