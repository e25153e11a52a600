//! A workload at another text density (`--density`): its text recoded
//! ([`Density::recode`]), its engines counting the bytes a token that
//! implies, and `kv_aware`'s instances, which count SmolLM2 tokens instead,
//! given as much more KV and prefill as SmolLM2 needs for the same text.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Content, Setup};
use kvgate_simulate::trace::TRACE_BLOCK_TOKENS;

use crate::density::Density;

/// Characters of recoded text the SmolLM2 ratio is measured on, at most.
const SAMPLE_CHARS: usize = 400_000;

impl Setup {
    /// This workload with its text at `density`: the same sessions, turns
    /// and tokens (so the caches sized for it still fit), other characters.
    /// Shared system prompts stay shared. Trace prompts are built at send
    /// time and recoded there (`driver`). At 4 (the workloads' own text) it
    /// is the workload unchanged.
    pub fn at_density(&self, density: Density) -> anyhow::Result<Setup> {
        let mut out = self.clone();
        out.density = density;
        if density.is_english() {
            return Ok(out);
        }
        let mut systems: HashMap<*const u8, Arc<str>> = HashMap::new();
        for s in &mut out.sessions {
            if let Some(p) = &s.system {
                let key = Arc::as_ptr(p).cast::<u8>();
                let recoded = systems
                    .entry(key)
                    .or_insert_with(|| Arc::from(density.recode(p)));
                s.system = Some(Arc::clone(recoded));
            }
            let forks = s.forks.iter_mut().flat_map(|f| f.turns.iter_mut());
            for t in s.turns.iter_mut().chain(forks) {
                if let Content::Chat(m) | Content::ToolResult(m) = &mut t.content {
                    *m = density.recode(m);
                }
            }
        }
        out.sim.bytes_per_token = density.bytes_per_token();
        out.kv_token_ratio = self.kv_token_ratio * smollm2_ratio(&out)?;
        Ok(out)
    }
}

/// SmolLM2 tokens a simulated token of `setup`'s text: over its distinct
/// system prompts and its messages, in order, up to [`SAMPLE_CHARS`]
/// (trace prompts built whole, as the driver builds them).
fn smollm2_ratio(setup: &Setup) -> anyhow::Result<f64> {
    let tok = crate::tokenizer::shared()?;
    let engine = setup.sim.token_bytes();
    let mut sample: Vec<String> = Vec::new();
    let mut seen: Vec<*const u8> = Vec::new();
    let mut chars = 0usize;
    'sessions: for s in &setup.sessions {
        if let Some(p) = &s.system
            && !seen.contains(&Arc::as_ptr(p).cast::<u8>())
        {
            seen.push(Arc::as_ptr(p).cast::<u8>());
            chars += p.len();
            sample.push(p.to_string());
        }
        for t in &s.turns {
            let text = match &t.content {
                Content::Chat(m) | Content::ToolResult(m) => m.clone(),
                // The driver's trace prompt is these blocks' text, recoded whole.
                Content::Trace { hash_ids, .. } => hash_ids
                    .iter()
                    .map(|&id| kvgate_sim::block_text(id, TRACE_BLOCK_TOKENS))
                    .collect::<String>(),
            };
            let text = match &t.content {
                Content::Trace { .. } => setup.density.recode(&text),
                _ => text,
            };
            chars += text.len();
            sample.push(text);
            if chars >= SAMPLE_CHARS {
                break 'sessions;
            }
        }
    }
    let (mut smol, mut sim) = (0usize, 0usize);
    for text in &sample {
        smol += tok.encode(text, false).len();
        sim += engine.count(text.as_bytes());
    }
    Ok(if sim == 0 || smol == 0 {
        1.0
    } else {
        smol as f64 / sim as f64
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::workload::Kind;

    #[test]
    fn a_recoded_workload_keeps_its_sessions_tokens_and_shared_prompts() {
        let base = Kind::SystemPrompts.setup(true, 3, Path::new(".")).unwrap();
        assert!(
            base.at_density(Density::ENGLISH).unwrap().sessions[0].system
                == base.sessions[0].system
        );
        let code = base.at_density(Density::new(2.0).unwrap()).unwrap();
        assert_eq!(code.requests(), base.requests());
        assert_eq!(code.sim.bytes_per_token, 2.0);
        assert_eq!(
            code.cache_tokens(),
            base.cache_tokens(),
            "same tokens, same cache"
        );
        let (a, b) = (&base.sessions, &code.sessions);
        let count = |t: &str, bpt: f64| kvgate_sim::TokenBytes::new(bpt).count(t.as_bytes()) as i64;
        for (x, y) in a.iter().zip(b) {
            let (Some(px), Some(py)) = (&x.system, &y.system) else {
                continue;
            };
            assert!((count(px, 4.0) - count(py, 2.0)).abs() <= 1);
        }
        // Sessions that shared a system prompt still share one (the same Arc).
        let shared = |s: &[super::super::Session]| {
            let mut ptrs: Vec<*const u8> = s
                .iter()
                .filter_map(|s| s.system.as_ref().map(|p| Arc::as_ptr(p).cast::<u8>()))
                .collect();
            ptrs.sort();
            ptrs.dedup();
            ptrs.len()
        };
        assert_eq!(shared(a), shared(b));
        assert!(
            code.kv_token_ratio > 0.5 && code.kv_token_ratio < 2.0,
            "{}",
            code.kv_token_ratio
        );
    }
}
