//! One instance's engine blocks: the engine's hash of each block it reported
//! (for its removals and its children's parent) → the tiers that engine block
//! is in and the position of its key's entry in the fleet-wide index
//! ([`super::fleet`]). 12 bytes and a control byte a block: the engine hash's
//! low 62 bits, two tier bits in its top two, and a 4-byte position.

use hashbrown::HashTable;

use super::EngineHash;
use super::fleet::Pos;

/// A hash of a value that is a hash already: spread over the table's bits.
pub fn mix(x: u64) -> u64 {
    let x = x ^ (x >> 32);
    let x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 29)
}

/// The engine hash as stored: its two top bits give way to the tiers (an
/// engine-hash collision then needs 62 equal bits).
pub fn engine_id(h: EngineHash) -> u64 {
    h & !(3 << 62)
}

/// `[low 32 bits, high 30 bits | tiers << 30, position]`.
type Slot = [u32; 3];

fn slot_of(id: u64, tiers: u32, pos: Pos) -> Slot {
    [id as u32, ((id >> 32) as u32) | (tiers << 30), pos]
}

fn id_of(s: &Slot) -> u64 {
    (u64::from(s[1] & !(3 << 30)) << 32) | u64::from(s[0])
}

#[derive(Debug, Default)]
pub struct Engines {
    table: HashTable<Slot>,
}

impl Engines {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn clear(&mut self) {
        self.table = HashTable::new();
    }

    /// The tiers (the fleet index's GPU and CPU bits) and entry position of
    /// the block the engine calls `h`.
    pub fn find(&self, h: EngineHash) -> Option<(u32, Pos)> {
        let id = engine_id(h);
        self.table
            .find(mix(id), |s| id_of(s) == id)
            .map(|s| (s[1] >> 30, s[2]))
    }

    /// Record (or overwrite) the block the engine calls `h`.
    pub fn set(&mut self, h: EngineHash, tiers: u32, pos: Pos) {
        let id = engine_id(h);
        let slot = slot_of(id, tiers, pos);
        match self.table.find_mut(mix(id), |s| id_of(s) == id) {
            Some(s) => *s = slot,
            None => {
                self.table.insert_unique(mix(id), slot, |s| mix(id_of(s)));
            }
        }
    }

    /// Record the block the engine calls `h`, known not to be recorded (a
    /// lookup just missed): one probe of the table instead of two.
    pub fn insert_new(&mut self, h: EngineHash, tiers: u32, pos: Pos) {
        let id = engine_id(h);
        self.table
            .insert_unique(mix(id), slot_of(id, tiers, pos), |s| mix(id_of(s)));
    }

    pub fn remove(&mut self, h: EngineHash) {
        let id = engine_id(h);
        if let Ok(e) = self.table.find_entry(mix(id), |s| id_of(s) == id) {
            e.remove();
        }
    }

    /// Every block's entry position.
    pub fn positions(&self) -> Vec<Pos> {
        self.table.iter().map(|s| s[2]).collect()
    }
}
