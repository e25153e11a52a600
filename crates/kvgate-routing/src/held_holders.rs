//! One shard of the fleet-wide index of held blocks ([`super::fleet`]): each
//! block kvgate's key names, stored once, with the set of instances holding
//! it and their tiers.
//!
//! Layout: a slab of 16-byte entries (the key; one holder inline; the index of
//! a spilled holder list, or none) in 16 KiB pages that never move, so an instance
//! may keep an entry's position (4 bytes) for its removals and parent
//! lookups; a hashbrown table of 4-byte positions by key for matching. A
//! block held by one instance costs 16 bytes plus 5 bytes a bucket (at most
//! 7/8 full); a block held by several costs that once, plus a sorted list of
//! 4 bytes a holder. Freed entries and lists are reused.
//!
//! A holder is one `u32`: the instance's slot in its top 24 bits, how many of
//! the instance's engine blocks carry this key (5 bits, saturating), and
//! three tier bits: on the GPU, offloaded to CPU, expected (a prompt sent to
//! the instance is being prefilled).

use hashbrown::HashTable;

use super::engines::mix;

pub const GPU: u32 = 1;
pub const CPU: u32 = 2;
pub const EXPECTED: u32 = 4;
pub const TIERS: u32 = GPU | CPU | EXPECTED;
/// One engine block of the instance carries the key.
pub const REF: u32 = 1 << 3;
const REFS: u32 = 31 << 3;
const SLOT_SHIFT: u32 = 8;
/// Most instance slots.
pub const MAX_SLOTS: u32 = 1 << (32 - SLOT_SHIFT);
const NONE: u32 = u32::MAX;

/// The instance slot of a holder.
pub fn slot(h: u32) -> u32 {
    h >> SLOT_SHIFT
}

/// A holder of `slot` with `rest` (refs and tiers).
pub fn holder(slot: u32, rest: u32) -> u32 {
    (slot << SLOT_SHIFT) | (rest & (REFS | TIERS))
}

pub fn refs(h: u32) -> u32 {
    (h & REFS) >> 3
}

/// Whether a holder record holds anything (a tier, or a reference).
fn live(h: u32) -> bool {
    h & (REFS | TIERS) != 0
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: u64,
    /// The only holder while `spill` is `NONE` (0: none, a free entry).
    one: u32,
    spill: u32,
}

const PAGE_BITS: u32 = 10;
/// Entries a page (16 KiB).
const PAGE: usize = 1 << PAGE_BITS;

/// Entries in pages that never move. One vector doubling as it grew copied
/// the whole shard under its write lock (about 25 MB a shard at 1,000
/// engines × 100k blocks) and freed each smaller copy, which jemalloc keeps
/// as dirty pages for seconds (2–3 B a held block at 256 × 2,048, in
/// bench/results/kv-ingest.md). Only a shard's last page is partly filled,
/// and only its first grows in place (a small fleet stays small).
#[derive(Debug, Default)]
struct Slab {
    pages: Vec<Vec<Entry>>,
    len: usize,
}

impl Slab {
    fn get(&self, at: u32) -> Option<&Entry> {
        self.pages
            .get((at >> PAGE_BITS) as usize)?
            .get(at as usize & (PAGE - 1))
    }

    fn get_mut(&mut self, at: u32) -> Option<&mut Entry> {
        self.pages
            .get_mut((at >> PAGE_BITS) as usize)?
            .get_mut(at as usize & (PAGE - 1))
    }

    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, e: Entry) {
        match self.pages.last_mut() {
            Some(page) if page.len() < PAGE => page.push(e),
            last => {
                let mut page = match last {
                    Some(_) => Vec::with_capacity(PAGE),
                    None => Vec::new(),
                };
                page.push(e);
                self.pages.push(page);
            }
        }
        self.len += 1;
    }
}

#[derive(Debug, Default)]
pub struct Shard {
    entries: Slab,
    free: Vec<u32>,
    by_key: HashTable<u32>,
    spills: Vec<Vec<u32>>,
    free_spills: Vec<u32>,
}

impl Shard {
    /// Blocks held (entries with a holder).
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn find(&self, key: u64) -> Option<u32> {
        let entries = &self.entries;
        self.by_key
            .find(mix(key), |&i| entries.get(i).is_some_and(|e| e.key == key))
            .copied()
    }

    pub fn key_at(&self, at: u32) -> Option<u64> {
        self.entries
            .get(at)
            .filter(|e| e.one != 0 || e.spill != NONE)
            .map(|e| e.key)
    }

    /// The holders of the entry at `at`, sorted by slot.
    pub fn holders(&self, at: u32) -> &[u32] {
        match self.entries.get(at) {
            Some(e) if e.spill != NONE => {
                self.spills.get(e.spill as usize).map_or(&[], Vec::as_slice)
            }
            Some(e) if e.one != 0 => std::slice::from_ref(&e.one),
            _ => &[],
        }
    }

    /// The holders of `key` into `out` (cleared first).
    pub fn holders_of(&self, key: u64, out: &mut Vec<u32>) {
        out.clear();
        if let Some(at) = self.find(key) {
            out.extend_from_slice(self.holders(at));
        }
    }

    /// The record of `slot` for the entry at `at` (0: none).
    pub fn record(&self, at: u32, slot: u32) -> u32 {
        let hs = self.holders(at);
        hs.binary_search_by_key(&slot, |&h| self::slot(h))
            .ok()
            .and_then(|i| hs.get(i).copied())
            .unwrap_or(0)
    }

    /// Change `slot`'s record for `key` to `f(record)` as [`Shard::update`],
    /// making the entry when it has none; its position and the new record.
    /// `None` when nothing is held or the shard is full (`max` entries).
    pub fn upsert(
        &mut self,
        key: u64,
        slot: u32,
        f: impl FnOnce(u32) -> u32,
        max: u32,
    ) -> Option<(u32, u32)> {
        if let Some(at) = self.find(key) {
            let r = self.update(at, slot, f);
            return Some((at, r));
        }
        let r = f(0);
        if !live(r) {
            return None;
        }
        let one = holder(slot, r);
        let e = Entry {
            key,
            one,
            spill: NONE,
        };
        let at = match self.free.pop() {
            Some(at) => {
                *self.entries.get_mut(at)? = e;
                at
            }
            None => {
                let at = u32::try_from(self.entries.len())
                    .ok()
                    .filter(|&n| n < max)?;
                self.entries.push(e);
                at
            }
        };
        let entries = &self.entries;
        let key_of = |&i: &u32| mix(entries.get(i).map_or(0, |e| e.key));
        self.by_key.insert_unique(mix(key), at, key_of);
        Some((at, one))
    }

    /// Change `slot`'s record at `at` to `f(record)` (0 passed in: it has
    /// none; 0 returned: it holds nothing). An entry left without holders is
    /// freed. Returns the new record. A free entry is left alone.
    pub fn update(&mut self, at: u32, slot: u32, f: impl FnOnce(u32) -> u32) -> u32 {
        let Some(e) = self.entries.get(at).copied() else {
            return 0;
        };
        if e.one == 0 && e.spill == NONE {
            return 0;
        }
        let old = self.record(at, slot);
        let new = f(old);
        let new = if live(new) { holder(slot, new) } else { 0 };
        if new == old {
            return new;
        }
        if e.spill == NONE {
            if self::slot(e.one) == slot || !live(e.one) {
                self.set_one(at, new);
            } else if new != 0 {
                let mut list = vec![e.one, new];
                list.sort_unstable_by_key(|&h| self::slot(h));
                self.spill(at, list);
            }
        } else if let Some(list) = self.spills.get_mut(e.spill as usize) {
            match list.binary_search_by_key(&slot, |&h| self::slot(h)) {
                Ok(i) if new == 0 => {
                    list.remove(i);
                }
                Ok(i) => list[i] = new,
                Err(i) => list.insert(i, new),
            }
            if list.len() <= 1 {
                let one = list.first().copied().unwrap_or(0);
                *list = Vec::new();
                self.free_spills.push(e.spill);
                if let Some(e) = self.entries.get_mut(at) {
                    e.spill = NONE;
                }
                self.set_one(at, one);
            }
        }
        new
    }

    fn set_one(&mut self, at: u32, one: u32) {
        let Some(e) = self.entries.get_mut(at) else {
            return;
        };
        e.one = one;
        if one == 0 && e.spill == NONE {
            let key = e.key;
            if let Ok(found) = self.by_key.find_entry(mix(key), |&i| i == at) {
                found.remove();
            }
            self.free.push(at);
        }
    }

    fn spill(&mut self, at: u32, list: Vec<u32>) {
        let idx = match self.free_spills.pop() {
            Some(i) => {
                if let Some(s) = self.spills.get_mut(i as usize) {
                    *s = list;
                }
                i
            }
            None => {
                self.spills.push(list);
                (self.spills.len() - 1) as u32
            }
        };
        if let Some(e) = self.entries.get_mut(at) {
            e.spill = idx;
            e.one = 0;
        }
    }
}
