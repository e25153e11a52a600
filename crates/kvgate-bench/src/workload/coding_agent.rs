//! Workload `coding-agent`: coding-agent sessions (Claude Code, SWE-bench
//! agents) that grow turn by turn to tens of thousands of tokens over one
//! system-and-tools prefix shared by every session, with sub-agents.
//!
//! The shape follows the published agent traces (`../shared/papers.md`, "Agent
//! traffic"): the SemiAnalysis/WEKA Claude Code traces — every request resends
//! a ~10k-token system-and-tools prefix, sessions grow to tens of thousands of
//! tokens over dozens of turns, sub-agents branch off them, and 96–98% of prompt
//! blocks are reusable on one infinite cache; the Mooncake FAST'25 tool-and-agent
//! trace (mean input 8,596 tokens); and llm-d's Claude Code run (91.4% prefill
//! hit against a 93.9% ceiling). Tool results dominate the growth: a file read,
//! a grep or a test log is hundreds to thousands of tokens, the model's tool
//! call a hundred or so.
//!
//! Each session: the shared prefix as the system message (the tool
//! definitions' text folded into it), a task (median 300 tokens), then turns
//! whose user message is a tool result (log-normal, median 600 tokens, 30–8,000)
//! and whose answer is a tool call (median 80 tokens). As in Anthropic's
//! Messages API, tool results travel in user messages: over chat as plain user
//! messages, over Messages (`--api messages`) as `tool_result` blocks answering
//! the previous answer sent back as a `tool_use` block ([`crate::conversation`]). Open loop only: the
//! tool's run time (log-normal, median 1.5 s) passes between an answer and the
//! next turn. Sub-agents fork the parent's history after one of its turns
//! (a delegation message, then a few tool-result turns of their own) and the
//! parent resumes when they finish, as a blocking `Task` call does; so a
//! sub-agent's prompts share the parent's prefix up to the fork, then diverge.

use std::sync::Arc;
use std::time::Duration;

use kvgate_sim::{SimConfig, block_text};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Content, Fork, Routing, Session, Setup, Size, Turn, exp_gap, log_normal};
use crate::regime::Regime;

/// Block ids of the shared prefix and of messages: disjoint from other workloads'.
const PREFIX_ID: u64 = 8 << 40;
const MESSAGE_BASE: u64 = 9 << 40;

struct Params {
    sessions: usize,
    /// Sessions started a second (Poisson).
    rate: f64,
    prefix_tokens: usize,
    turns: (usize, usize),
    /// Most sub-agents a session (0 ..= this, uniform) and their turns.
    forks: usize,
    fork_turns: (usize, usize),
    tool_median: f64,
    time_scale: f64,
}

pub(super) fn setup(size: Size, seed: u64) -> Setup {
    let p = match size {
        Size::Full => Params {
            sessions: 24,
            rate: 0.1,
            prefix_tokens: 10_000,
            turns: (16, 48),
            forks: 2,
            fork_turns: (3, 6),
            tool_median: 600.0,
            time_scale: 0.05,
        },
        Size::Matrix => Params {
            sessions: 8,
            rate: 0.2,
            prefix_tokens: 10_000,
            turns: (12, 30),
            forks: 2,
            fork_turns: (3, 6),
            tool_median: 600.0,
            time_scale: 0.01,
        },
        Size::Quick | Size::MatrixQuick => Params {
            sessions: 2,
            rate: 2.0,
            prefix_tokens: 2_000,
            turns: (3, 5),
            forks: 1,
            fork_turns: (2, 2),
            tool_median: 200.0,
            time_scale: 0.01,
        },
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6361);
    let prefix: Arc<str> = Arc::from(block_text(PREFIX_ID, p.prefix_tokens));
    let mut next_id = MESSAGE_BASE;
    let mut at = Duration::ZERO;
    let sessions = (0..p.sessions)
        .map(|_| {
            at += exp_gap(&mut rng, p.rate);
            let count = rng.random_range(p.turns.0..=p.turns.1);
            let mut turns = vec![turn(&mut rng, &mut next_id, 300.0, false)];
            turns.extend((1..count).map(|_| turn(&mut rng, &mut next_id, p.tool_median, true)));
            let forks = (0..rng.random_range(0..=p.forks))
                .map(|_| {
                    let n = rng.random_range(p.fork_turns.0..=p.fork_turns.1);
                    let mut turns = vec![turn(&mut rng, &mut next_id, 120.0, false)];
                    turns.extend((1..n).map(|_| turn(&mut rng, &mut next_id, p.tool_median, true)));
                    Fork {
                        after: rng.random_range(1..count.max(2)),
                        turns,
                    }
                })
                .collect();
            Session {
                start: at,
                system: Some(Arc::clone(&prefix)),
                turns,
                forks,
            }
        })
        .collect();
    let setup = Setup {
        id: "coding-agent".to_owned(),
        description: String::new(),
        instances: 7,
        sim: SimConfig {
            time_scale: p.time_scale,
            ..SimConfig::llama70b_h100_tp4()
        },
        routing: Routing {
            prefix_length: 4096,
            concurrency_threshold: 64,
            balance_factor: Some(1.2),
        },
        sessions,
        trace_ceiling: None,
        cache_scale: 1.0,
        gateways: 1,
        separate_processes: false,
        kv_token_ratio: 1.0,
        kv_prefill_ratio: None,
        density: super::Density::ENGLISH,
        regime: Regime::default(),
    };
    let description = format!(
        "{} coding-agent sessions arriving Poisson at {}/s (simulated), {}–{} turns each over \
         one shared {}-token system-and-tools prefix; a task of median 300 tokens, then tool \
         results (log-normal, median {} tokens, 30–8,000) as user messages, tool calls of \
         median 80 tokens as answers, the tool's run time (median 1.5 s) between them; up to \
         {} sub-agents a session fork its history after a turn and run {}–{} turns of their \
         own. {} requests in all. `prefix_length` (4,096 characters) ends inside the shared \
         prefix: `prefix_aware` has one key for every session.",
        p.sessions,
        p.rate,
        p.turns.0,
        p.turns.1,
        p.prefix_tokens,
        p.tool_median,
        p.forks,
        p.fork_turns.0,
        p.fork_turns.1,
        setup.requests(),
    );
    Setup {
        description,
        ..setup
    }
}

/// One turn: a message of log-normal length around `median` tokens (a tool
/// result when `tool`, which also waits the tool's run time first) answered
/// by a tool call.
fn turn(rng: &mut impl Rng, next_id: &mut u64, median: f64, tool: bool) -> Turn {
    *next_id += 1;
    let tokens = if tool {
        log_normal(rng, median, 1.1, 30.0, 8_000.0)
    } else {
        log_normal(rng, median, 0.6, 20.0, 2_000.0)
    };
    Turn {
        think: if tool {
            Duration::from_secs_f64(log_normal(rng, 1.5, 0.8, 0.2, 20.0))
        } else {
            Duration::ZERO
        },
        max_tokens: log_normal(rng, 80.0, 0.7, 16.0, 600.0) as u32,
        content: if tool {
            Content::ToolResult(block_text(*next_id, tokens as usize))
        } else {
            Content::Chat(block_text(*next_id, tokens as usize))
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_share_the_prefix_grow_and_fork() {
        let setup = setup(Size::Matrix, 7);
        let first = setup.sessions[0].system.clone().unwrap();
        assert!(
            setup
                .sessions
                .iter()
                .all(|s| s.system.as_ref() == Some(&first))
        );
        assert_eq!(first.len(), 10_000 * kvgate_sim::BYTES_PER_TOKEN);
        let forks: usize = setup.sessions.iter().map(|s| s.forks.len()).sum();
        assert!(forks > 0);
        for s in &setup.sessions {
            assert!((12..=30).contains(&s.turns.len()));
            assert!(s.forks.iter().all(|f| f.after < s.turns.len()));
        }
        // Tens of thousands of tokens by the last turn, on average.
        let bytes: usize = setup
            .sessions
            .iter()
            .map(|s| {
                s.turns
                    .iter()
                    .map(|t| match &t.content {
                        Content::Chat(m) | Content::ToolResult(m) => {
                            m.len() + 4 * t.max_tokens as usize
                        }
                        Content::Trace { .. } => 0,
                    })
                    .sum::<usize>()
            })
            .sum();
        let mean_tokens = 10_000 + bytes / 4 / setup.sessions.len();
        assert!((20_000..80_000).contains(&mean_tokens), "{mean_tokens}");
    }
}
