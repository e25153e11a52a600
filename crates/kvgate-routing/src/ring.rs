//! A consistent-hash ring of virtual nodes, built from instance ids alone.
//!
//! Each instance id is hashed to `virtual_nodes` points with seedless xxh3, so
//! every gateway replica and every restart builds the same ring. A key's
//! clockwise walk from its position yields every instance exactly once: the
//! preference order. Adding one of n instances takes over about 1/(n+1) of
//! keys and moves nothing else. Build: O(n·v log(n·v)); lookup: O(log(n·v))
//! plus the walk, which stops after n distinct instances.

use xxhash_rust::xxh3::xxh3_64;

#[derive(Debug, Clone)]
pub struct Ring {
    /// The points, sorted.
    points: Vec<u64>,
    /// Each point's instance index, beside rather than with it: a walk reads
    /// only these, ~7,500 of them at 1,000 instances.
    owners: Vec<u32>,
    instances: usize,
}

impl Ring {
    /// Build a ring over `ids` (index i of the walk refers to `ids[i]`).
    pub fn new(ids: &[String], virtual_nodes: usize) -> Self {
        let mut points = Vec::with_capacity(ids.len() * virtual_nodes);
        for (i, id) in ids.iter().enumerate() {
            let Ok(idx) = u32::try_from(i) else { break };
            let mut buf = Vec::with_capacity(id.len() + 9);
            for v in 0..virtual_nodes {
                buf.clear();
                buf.extend_from_slice(id.as_bytes());
                buf.push(0);
                buf.extend_from_slice(&(v as u64).to_le_bytes());
                points.push((xxh3_64(&buf), idx));
            }
        }
        // Ties between ids are broken by index so the order is total and stable.
        points.sort_unstable();
        let (points, owners) = points.into_iter().unzip();
        Self {
            points,
            owners,
            instances: ids.len(),
        }
    }

    pub fn len(&self) -> usize {
        self.instances
    }

    pub fn is_empty(&self) -> bool {
        self.instances == 0
    }

    /// Every instance index once, in clockwise order from `key`.
    pub fn walk(&self, key: u64) -> Walk<'_> {
        let start = self.points.partition_point(|&p| p < key);
        Walk {
            ring: self,
            pos: start,
            steps: 0,
            seen: Seen::new(self.instances),
            left: self.instances,
        }
    }

    /// The preferred instance for `key` (the walk's first), if any.
    pub fn primary(&self, key: u64) -> Option<usize> {
        self.walk(key).next()
    }
}

/// Iterator over a key's candidate order.
pub struct Walk<'a> {
    ring: &'a Ring,
    pos: usize,
    steps: usize,
    seen: Seen,
    left: usize,
}

impl Iterator for Walk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let owners = &self.ring.owners;
        while self.left > 0 && self.steps < owners.len() {
            // Wrapped by a compare, not `%`: a walk over 1,000 instances takes
            // ~7,500 steps (coupon collecting), and a division each was a
            // third of the whole plan's time.
            if self.pos >= owners.len() {
                self.pos = 0;
            }
            let idx = owners[self.pos];
            self.pos += 1;
            self.steps += 1;
            let idx = idx as usize;
            if self.seen.insert(idx) {
                self.left -= 1;
                return Some(idx);
            }
        }
        None
    }
}

/// A small set of instance indices: a bit mask up to 64, a vector beyond.
enum Seen {
    Bits(u64),
    Vec(Vec<bool>),
}

impl Seen {
    fn new(n: usize) -> Self {
        if n <= 64 {
            Self::Bits(0)
        } else {
            Self::Vec(vec![false; n])
        }
    }

    /// True when `i` was not yet present.
    fn insert(&mut self, i: usize) -> bool {
        match self {
            Self::Bits(b) => {
                let m = 1u64 << i;
                let fresh = *b & m == 0;
                *b |= m;
                fresh
            }
            Self::Vec(v) => match v.get_mut(i) {
                Some(slot) if !*slot => {
                    *slot = true;
                    true
                }
                _ => false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://10.0.0.{i}:8000")).collect()
    }

    fn key(i: u64) -> u64 {
        xxh3_64(&i.to_le_bytes())
    }

    #[test]
    fn walk_visits_every_instance_once() {
        let ring = Ring::new(&ids(7), 160);
        let mut order: Vec<usize> = ring.walk(12345).collect();
        assert_eq!(order.len(), 7);
        order.sort_unstable();
        assert_eq!(order, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn same_ids_same_ring_regardless_of_build() {
        let a = Ring::new(&ids(5), 100);
        let b = Ring::new(&ids(5), 100);
        for k in 0..1000 {
            assert_eq!(a.primary(key(k)), b.primary(key(k)));
        }
    }

    #[test]
    fn more_than_64_instances_walk_fully() {
        let ring = Ring::new(&ids(100), 20);
        assert_eq!(ring.walk(7).count(), 100);
    }

    #[test]
    fn empty_ring_walks_nothing() {
        let ring = Ring::new(&[], 100);
        assert_eq!(ring.primary(1), None);
    }

    fn share(ring: &Ring, keys: u64) -> Vec<f64> {
        let mut counts = vec![0u64; ring.len()];
        for k in 0..keys {
            if let Some(p) = ring.primary(key(k)) {
                counts[p] += 1;
            }
        }
        counts.iter().map(|&c| c as f64 / keys as f64).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// With 160 virtual nodes every instance owns within ±40% of its fair share.
        #[test]
        fn balance(n in 2usize..16) {
            let ring = Ring::new(&ids(n), 160);
            let fair = 1.0 / n as f64;
            for s in share(&ring, 20_000) {
                prop_assert!((s - fair).abs() < 0.4 * fair, "share {s} vs fair {fair}");
            }
        }

        /// Adding one instance moves only keys that now land on it, about 1/(n+1) of them.
        #[test]
        fn minimal_movement_on_add(n in 2usize..16) {
            let before = Ring::new(&ids(n), 160);
            let after = Ring::new(&ids(n + 1), 160);
            let keys = 20_000u64;
            let mut moved = 0u64;
            for k in 0..keys {
                let (a, b) = (before.primary(key(k)), after.primary(key(k)));
                if a != b {
                    prop_assert_eq!(b, Some(n), "a key moved between two old instances");
                    moved += 1;
                }
            }
            let frac = moved as f64 / keys as f64;
            let ideal = 1.0 / (n as f64 + 1.0);
            prop_assert!((frac - ideal).abs() < 0.5 * ideal, "moved {frac}, ideal {ideal}");
        }

        /// Removing an instance moves only the keys it owned.
        #[test]
        fn minimal_movement_on_remove(n in 3usize..16, gone in 0usize..16) {
            let gone = gone % n;
            let all = ids(n);
            let rest: Vec<String> = all.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, s)| s.clone()).collect();
            let before = Ring::new(&all, 160);
            let after = Ring::new(&rest, 160);
            for k in 0..5_000u64 {
                let a = before.primary(key(k)).map(|i| all[i].clone());
                let b = after.primary(key(k)).map(|i| rest[i].clone());
                if a.as_deref() != Some(all[gone].as_str()) {
                    prop_assert_eq!(a, b);
                }
            }
        }
    }
}
