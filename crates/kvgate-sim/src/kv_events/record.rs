//! Turning a sequence's newly computed blocks into `BlockStored` events: one per
//! run of consecutive blocks that became cached, chained to the block before it.

use std::ops::Range;
use std::sync::Arc;

use super::KvEvent;
use crate::cache::KvCache;

/// What a sequence's `BlockStored` events need besides its hashes.
#[derive(Clone, Debug, Default)]
pub(crate) struct SeqKv {
    /// Token ids of the prompt's full blocks, `block_size` a block.
    pub token_ids: Vec<u32>,
    pub cache_salt: Option<Arc<str>>,
}

/// Mark blocks `range` of a prompt (`hashes`) computed in `cache`; when `events`
/// is given, push a `BlockStored` for each run of them that was not cached before
/// (a block another sequence already computed is not stored twice).
pub(crate) fn mark_computed(
    cache: &mut KvCache,
    hashes: &[u64],
    range: Range<usize>,
    kv: Option<&SeqKv>,
    events: Option<&mut Vec<KvEvent>>,
    block_size: usize,
) {
    let Some(blocks) = hashes.get(range.clone()) else {
        return;
    };
    let (Some(kv), Some(events)) = (kv, events) else {
        blocks.iter().for_each(|&h| {
            cache.mark_computed(h);
        });
        return;
    };
    let mut run: Option<usize> = None;
    for (i, &h) in range.clone().zip(blocks) {
        match (cache.mark_computed(h), run) {
            (true, None) => run = Some(i),
            (false, Some(start)) => {
                events.push(stored(hashes, start..i, kv, block_size));
                run = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run {
        events.push(stored(hashes, start..range.end, kv, block_size));
    }
}

fn stored(hashes: &[u64], run: Range<usize>, kv: &SeqKv, block_size: usize) -> KvEvent {
    let tokens = run.start * block_size..run.end * block_size;
    KvEvent::Stored {
        hashes: hashes.get(run.clone()).unwrap_or_default().to_vec(),
        parent: run
            .start
            .checked_sub(1)
            .and_then(|p| hashes.get(p).copied()),
        token_ids: kv.token_ids.get(tokens).unwrap_or_default().to_vec(),
        salt: if run.start == 0 {
            kv.cache_salt.clone()
        } else {
            None
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_newly_cached_blocks_become_chained_events() {
        let mut cache = KvCache::new(100);
        let hashes: Vec<u64> = (100..106).collect();
        cache.try_acquire(&hashes, 0, usize::MAX).unwrap();
        cache.mark_computed(102); // another sequence got there first
        let kv = SeqKv {
            token_ids: (0..12).collect(),
            cache_salt: Some("s".into()),
        };
        let mut events = Vec::new();
        mark_computed(&mut cache, &hashes, 0..4, Some(&kv), Some(&mut events), 2);
        mark_computed(&mut cache, &hashes, 4..6, Some(&kv), Some(&mut events), 2);
        let expect =
            |hashes: Vec<u64>, parent, token_ids: Vec<u32>, salt: Option<&str>| KvEvent::Stored {
                hashes,
                parent,
                token_ids,
                salt: salt.map(Into::into),
            };
        assert_eq!(
            events,
            vec![
                expect(vec![100, 101], None, vec![0, 1, 2, 3], Some("s")),
                expect(vec![103], Some(102), vec![6, 7], None),
                expect(vec![104, 105], Some(103), vec![8, 9, 10, 11], None),
            ]
        );
    }
}
