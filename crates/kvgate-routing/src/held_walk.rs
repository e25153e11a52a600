//! One walk down a request's block keys for a whole fleet: how much of the
//! chain each instance holds, from each block's holder set, instead of one
//! walk an instance.
//!
//! An instance's match continues while it holds the next block (in a tier, or
//! expected) or the shared L2 tier does; it ends at the first block neither
//! holds. The walk keeps the set of instances still matching (a bitset over
//! slots) and stops when it is empty and L2 no longer holds every block so
//! far. Instances that hold nothing of the prompt are never visited: they
//! match what L2 holds of its start. Consecutive blocks with the same holders
//! (a system prompt's blocks, held together) are counted as one run, so the
//! per-instance work is per change of holders, not per block: O(blocks ×
//! holders of a block) in the worst case, O(blocks + changes × holders) usually.

use super::holders::{CPU, GPU, TIERS, slot};
use super::{Held, TierWeights};

const CLASSES: usize = 4;
const L2: usize = 3;

fn class(h: u32) -> usize {
    if h & GPU != 0 {
        0
    } else if h & CPU != 0 {
        1
    } else {
        2
    }
}

struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Self(vec![0; n.div_ceil(64)])
    }
    fn get(&self, i: u32) -> bool {
        self.0
            .get(i as usize / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    fn set(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut(i as usize / 64) {
            *w |= 1 << (i % 64);
        }
    }
    fn clear(&mut self) {
        self.0.fill(0);
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    fn ones(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros();
                    w &= w - 1;
                    i as u32 * 64 + b
                })
            })
        })
    }
}

/// How much of `keys` each of `slots` instances holds, by slot; `holders_of`
/// writes a key's holders (sorted by slot) into its vector; `shared` is the
/// slot of the L2 tier every instance reaches, when it is to count.
pub fn walk(
    keys: &[u64],
    slots: usize,
    shared: Option<u32>,
    w: TierWeights,
    mut holders_of: impl FnMut(u64, &mut Vec<u32>),
) -> Vec<Held> {
    let mut counts = vec![[0u32; CLASSES]; slots];
    let mut alive = Bits::new(slots);
    let mut joined = Bits::new(slots);
    let mut in_prev = Bits::new(slots);
    let (mut cur, mut prev) = (Vec::new(), Vec::new());
    let (mut prev_l2, mut run) = (false, 0u32);
    // L2 held every block so far (vacuously at the start).
    let mut l2_open = true;
    let mut l2_len = 0usize;
    let flush = |prev: &[u32],
                 prev_l2: bool,
                 run: u32,
                 alive: &Bits,
                 in_prev: &Bits,
                 counts: &mut [[u32; CLASSES]]| {
        for &h in prev {
            if alive.get(slot(h))
                && let Some(c) = counts.get_mut(slot(h) as usize)
            {
                c[class(h)] += run;
            }
        }
        if prev_l2 {
            for s in alive.ones().filter(|&s| !in_prev.get(s)) {
                if let Some(c) = counts.get_mut(s as usize) {
                    c[L2] += run;
                }
            }
        }
    };
    for (i, &k) in keys.iter().enumerate() {
        holders_of(k, &mut cur);
        let l2 = shared.is_some_and(|s| cur.iter().any(|&h| slot(h) == s && h & (GPU | CPU) != 0));
        cur.retain(|&h| h & TIERS != 0 && Some(slot(h)) != shared);
        if run > 0 && cur == prev && l2 == prev_l2 {
            run += 1;
            continue;
        }
        flush(&prev, prev_l2, run, &alive, &in_prev, &mut counts);
        if !l2 {
            let mut next = Bits::new(slots);
            for &h in &cur {
                if alive.get(slot(h)) {
                    next.set(slot(h));
                }
            }
            alive = next;
        }
        if l2_open {
            for &h in &cur {
                let s = slot(h);
                if !joined.get(s) && (s as usize) < slots {
                    joined.set(s);
                    alive.set(s);
                    if let Some(c) = counts.get_mut(s as usize) {
                        c[L2] = i as u32;
                    }
                }
            }
            if !l2 {
                l2_open = false;
                l2_len = i;
            }
        }
        std::mem::swap(&mut prev, &mut cur);
        in_prev.clear();
        for &h in &prev {
            in_prev.set(slot(h));
        }
        prev_l2 = l2;
        run = 1;
        if alive.is_empty() && !l2_open {
            run = 0;
            break;
        }
    }
    if l2_open {
        l2_len = keys.len();
    }
    flush(&prev, prev_l2, run, &alive, &in_prev, &mut counts);
    counts
        .iter()
        .enumerate()
        .map(|(s, c)| {
            if !joined.get(s as u32) {
                return Held {
                    blocks: l2_len,
                    gpu_blocks: 0,
                    expected_blocks: 0,
                    weighted: l2_len as f64 * w.l2,
                };
            }
            let [gpu, cpu, exp, l2] = c.map(f64::from);
            Held {
                blocks: c.iter().map(|&n| n as usize).sum(),
                gpu_blocks: c[0] as usize,
                expected_blocks: c[2] as usize,
                weighted: gpu + exp + cpu * w.cpu + l2 * w.l2,
            }
        })
        .collect()
}
