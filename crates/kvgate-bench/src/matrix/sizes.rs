//! Each workload at the matrix's size: fewer requests than `routing.md`'s
//! (140 cells × 3 strategies in about 25 minutes on 2 cores), 4 instances
//! instead of 7, and each instance's KV cache sized to the workload so it is
//! under pressure: about twice its share of the workload's distinct tokens
//! (the long-context regime: a cache holds twice its share of the
//! documents, so copying a prefix to a second instance evicts another), once
//! its share for the Mooncake traces (whose full replay's fleet holds a
//! fraction of the trace), and never less than 3× the largest request.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use crate::workload::{Content, Kind, Session, Setup, Size};

/// Instances in every matrix cell.
pub const INSTANCES: usize = 4;

/// `kind` at the matrix's size (`quick`: seconds, for CI), on 4 instances
/// with its cache sized by the rule above.
pub fn setup(kind: Kind, quick: bool, seed: u64, traces: &Path) -> anyhow::Result<Setup> {
    let size = if quick {
        Size::MatrixQuick
    } else {
        Size::Matrix
    };
    fitted(kind, size, seed, traces)
}

/// `kind` at `size`, on 4 instances with its cache sized by the rule above.
pub fn fitted(kind: Kind, size: Size, seed: u64, traces: &Path) -> anyhow::Result<Setup> {
    let mut setup = kind.setup_sized(size, seed, traces)?;
    let own = setup.description.clone();
    setup.instances = INSTANCES;
    let shares = match kind {
        Kind::MooncakeConversation | Kind::MooncakeSynthetic => 1.0,
        _ => 2.0,
    };
    let (distinct, largest) = footprint(&setup.sessions);
    let by_share = shares * distinct as f64 / INSTANCES as f64;
    let tokens = by_share.max(3.0 * largest as f64);
    let block = setup.sim.block_size.max(1);
    setup.sim.cache_blocks = ((tokens / block as f64).ceil() as usize).max(1);
    setup.description = format!(
        "{} requests on {INSTANCES} instances; {distinct} distinct prompt-and-answer tokens, \
         so each instance's cache of {} tokens holds {:.1}× its share of them (the largest \
         request needs {largest}). time_scale {}. {}",
        setup.requests(),
        setup.cache_tokens(),
        setup.cache_tokens() as f64 * INSTANCES as f64 / distinct.max(1) as f64,
        setup.sim.time_scale,
        without_fleet(&own),
    );
    Ok(setup)
}

/// Distinct tokens the sessions bring (shared system prompts and trace
/// blocks counted once; each turn's message and answer) and the largest
/// single request (prompt plus answer).
pub fn footprint(sessions: &[Session]) -> (usize, usize) {
    let bpt = kvgate_sim::BYTES_PER_TOKEN;
    let mut systems: HashSet<*const u8> = HashSet::new();
    let mut blocks: HashSet<u64> = HashSet::new();
    let (mut distinct, mut largest) = (0usize, 0usize);
    for s in sessions {
        let system = s.system.as_ref().map_or(0, |p| p.len() / bpt);
        if let Some(p) = &s.system
            && systems.insert(Arc::as_ptr(p).cast::<u8>())
        {
            distinct += system;
        }
        let mut context = system;
        let forks = s.forks.iter().flat_map(|f| f.turns.iter());
        for t in s.turns.iter().chain(forks) {
            let answer = t.max_tokens as usize;
            match &t.content {
                Content::Chat(m) | Content::ToolResult(m) => {
                    distinct += m.len() / bpt + answer;
                    context += m.len() / bpt + answer;
                    largest = largest.max(context);
                }
                Content::Trace { hash_ids, tokens } => {
                    let fresh = hash_ids.iter().filter(|&&id| blocks.insert(id)).count();
                    distinct += fresh * 512 + answer;
                    largest = largest.max(tokens + answer);
                }
            }
        }
    }
    (distinct, largest)
}

/// A workload's description up to where it describes its own fleet.
fn without_fleet(description: &str) -> &str {
    let cut = description
        .find(". 7 instances")
        .map_or(description.len(), |i| i + 1);
    description.get(..cut).unwrap_or(description)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_context_caches_hold_twice_their_share_of_documents() {
        let dir = Path::new(".");
        let s = setup(Kind::LongContext, false, 7, dir).unwrap();
        assert_eq!(s.instances, INSTANCES);
        // 16 documents of 8,000 tokens (plus questions and answers): ~8 each.
        let docs = s.cache_tokens() as f64 / 8_000.0;
        assert!((8.0..9.5).contains(&docs), "{docs} documents an instance");
        assert!(!s.description.contains("7 instances"), "{}", s.description);
    }
}
