//! Property tests of [`BlockIndex`] against a naive reference: a `Vec` LRU of
//! chain hashes, each insert touching its chain deepest block first, and
//! `matched` as a linear scan for the longest held prefix. Chains are paths in
//! a small tree of prefixes (shared heads, many branches), so matches, partial
//! matches and tail-first eviction all happen often; capacities are tiny.

use proptest::prelude::*;

use super::BlockIndex;

/// The block size every index here is cut with (only a change of it matters).
const BLOCK: usize = 256;

/// A node of the prefix tree: the branch taken at each level from the root.
type Path = Vec<u8>;

/// The chain of hashes from the root to `path`: block `i` stands for
/// `path[..=i]`. Injective up to depth 30 (base-4 digits 1..=3 behind a
/// leading 1), then scrambled by an odd multiplier, which keeps it injective.
fn chain(path: &[u8]) -> Vec<u64> {
    let mut code = 1u64;
    path.iter()
        .map(|&b| {
            code = code * 4 + u64::from(b % 3) + 1;
            code.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        })
        .collect()
}

/// The reference: least recently used first.
#[derive(Debug)]
struct Model {
    cap: usize,
    lru: Vec<u64>,
}

impl Model {
    fn matched(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|h| self.lru.contains(h)).count()
    }

    fn touch(&mut self, h: u64) {
        if let Some(at) = self.lru.iter().position(|&x| x == h) {
            self.lru.remove(at);
        } else if self.lru.len() == self.cap {
            self.lru.remove(0);
        }
        self.lru.push(h);
    }

    /// A chain longer than the cache keeps its head: only `cap` blocks are touched.
    /// `(from, len)`: where the new blocks start, and the size after.
    fn insert(&mut self, chain: &[u64]) -> (usize, usize) {
        let chain = &chain[..chain.len().min(self.cap)];
        let from = self.matched(chain);
        for &h in chain.iter().rev() {
            self.touch(h);
        }
        (from, self.lru.len())
    }

    fn forget(&mut self, chain: &[u64], from: usize) {
        for h in chain.iter().skip(from) {
            self.lru.retain(|x| x != h);
        }
    }

    fn resize(&mut self, cap: usize) {
        while self.lru.len() > cap {
            self.lru.remove(0);
        }
        self.cap = cap;
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Path),
    /// An insert for a request that never reached the instance, taken back at once.
    InsertThenForget(Path),
    Resize(usize),
    Query(Path),
}

fn path(max_depth: usize) -> impl Strategy<Value = Path> {
    prop::collection::vec(0u8..3, 0..=max_depth)
}

fn op(max_depth: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => path(max_depth).prop_map(Op::Insert),
        2 => path(max_depth).prop_map(Op::InsertThenForget),
        1 => (1usize..=24).prop_map(Op::Resize),
        2 => path(max_depth).prop_map(Op::Query),
    ]
}

fn op_path(op: &Op) -> Option<&Path> {
    match op {
        Op::Insert(p) | Op::InsertThenForget(p) | Op::Query(p) => Some(p),
        Op::Resize(_) => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever is inserted, forgotten or resized, the index never holds more
    /// than its capacity, and a chain longer than the cache is cut to it.
    #[test]
    fn memory_stays_bounded(cap in 1usize..=24, ops in prop::collection::vec(op(30), 1..80)) {
        let idx = BlockIndex::new(cap, BLOCK);
        let mut cap = cap;
        for op in &ops {
            match op {
                Op::Insert(p) => {
                    let ins = idx.insert(&chain(p));
                    prop_assert!(ins.len <= cap, "insert reported {} > {cap}", ins.len);
                    prop_assert_eq!(idx.matched(&chain(p)), p.len().min(cap));
                }
                Op::InsertThenForget(p) => {
                    let c = chain(p);
                    let ins = idx.insert(&c);
                    idx.forget(&c, ins);
                    prop_assert_eq!(idx.matched(&c), ins.from);
                }
                Op::Resize(n) => {
                    idx.configure(*n, BLOCK);
                    cap = *n;
                }
                Op::Query(p) => {
                    prop_assert!(idx.matched(&chain(p)) <= p.len().min(cap));
                }
            }
            prop_assert!(idx.len() <= cap, "{} blocks held, capacity {cap}", idx.len());
            prop_assert_eq!(idx.capacity(), cap);
        }
    }

    /// `matched` (a binary search that relies on the held set being
    /// prefix-closed) equals the reference's linear longest held prefix, for
    /// every chain seen so far, after every operation; inserts report what the
    /// reference says they added.
    #[test]
    fn matched_equals_the_reference_lru(
        cap in 1usize..=24,
        ops in prop::collection::vec(op(12), 1..60),
    ) {
        let idx = BlockIndex::new(cap, BLOCK);
        let mut model = Model { cap, lru: Vec::new() };
        let probes: Vec<Vec<u64>> = ops.iter().filter_map(op_path).map(|p| chain(p)).collect();
        for (n, op) in ops.iter().enumerate() {
            match op {
                Op::Insert(p) => {
                    let c = chain(p);
                    let ins = idx.insert(&c);
                    prop_assert_eq!((ins.from, ins.len), model.insert(&c), "insert at op {}", n);
                }
                Op::InsertThenForget(p) => {
                    let c = chain(p);
                    let ins = idx.insert(&c);
                    prop_assert_eq!((ins.from, ins.len), model.insert(&c), "insert at op {}", n);
                    idx.forget(&c, ins);
                    model.forget(&c, ins.from);
                }
                Op::Resize(k) => {
                    idx.configure(*k, BLOCK);
                    model.resize(*k);
                }
                Op::Query(_) => {}
            }
            prop_assert_eq!(idx.len(), model.lru.len(), "len after op {}: {:?}", n, op);
            for c in &probes {
                prop_assert_eq!(idx.matched(c), model.matched(c), "after op {}: {:?}", n, op);
            }
        }
    }
}

#[test]
fn the_tree_encoding_is_injective_and_chained() {
    let a = chain(&[0, 1, 2]);
    let b = chain(&[0, 1, 0]);
    assert_eq!(a[..2], b[..2], "a shared head hashes alike");
    assert_ne!(a[2], b[2]);
    assert_ne!(
        chain(&[1])[0],
        chain(&[0, 1])[1],
        "depth is part of the hash"
    );
}
