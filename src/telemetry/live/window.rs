//! [`Window`]: K counters over the last minute, one slot a second in a ring
//! of 60, added to with relaxed atomics. A slot found holding an older
//! second is claimed by compare-and-swap and zeroed; an add racing that
//! reset may be lost, which a console figure can afford and a lock on the
//! request path could not.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const SLOTS: usize = 60;
/// A slot's second before its first use.
const NEVER: u64 = u64::MAX;

#[derive(Debug)]
struct Slot<const K: usize> {
    second: AtomicU64,
    v: [AtomicU64; K],
}

#[derive(Debug)]
pub struct Window<const K: usize> {
    slots: [Slot<K>; SLOTS],
}

impl<const K: usize> Default for Window<K> {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| Slot {
                second: AtomicU64::new(NEVER),
                v: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        }
    }
}

impl<const K: usize> Window<K> {
    /// Add `v` to the current second.
    pub fn add(&self, v: [u64; K]) {
        self.add_at(super::now_s(), v);
    }

    fn add_at(&self, now: u64, v: [u64; K]) {
        let slot = &self.slots[(now % SLOTS as u64) as usize];
        let seen = slot.second.load(Relaxed);
        if seen != now
            && slot
                .second
                .compare_exchange(seen, now, Relaxed, Relaxed)
                .is_ok()
        {
            for c in &slot.v {
                c.store(0, Relaxed);
            }
        }
        for (c, x) in slot.v.iter().zip(v) {
            if x > 0 {
                c.fetch_add(x, Relaxed);
            }
        }
    }

    /// The sums over the last `secs` seconds (at most 60), this one included.
    pub fn sum(&self, secs: u64) -> [u64; K] {
        self.sum_at(super::now_s(), secs)
    }

    fn sum_at(&self, now: u64, secs: u64) -> [u64; K] {
        let secs = secs.min(SLOTS as u64);
        let mut out = [0; K];
        for slot in &self.slots {
            let s = slot.second.load(Relaxed);
            if s != NEVER && s <= now && now - s < secs {
                for (o, c) in out.iter_mut().zip(&slot.v) {
                    *o += c.load(Relaxed);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_last_minute_and_forgets_older_seconds() {
        let w = Window::<2>::default();
        w.add_at(10, [1, 100]);
        w.add_at(10, [1, 50]);
        w.add_at(40, [1, 10]);
        assert_eq!(w.sum_at(40, 60), [3, 160]);
        assert_eq!(w.sum_at(40, 1), [1, 10]);
        // 70 reuses second 10's slot: its old counts are gone.
        w.add_at(70, [1, 1]);
        assert_eq!(w.sum_at(70, 60), [2, 11]);
        assert_eq!(w.sum_at(200, 60), [0, 0], "nothing in the last minute");
    }
}
