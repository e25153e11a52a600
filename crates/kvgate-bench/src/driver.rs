//! Plays a workload's sessions against a gateway on the simulated clock: each
//! session starts at its time (scaled to real time), sends its turns one after
//! another, and for chat keeps the history with the answers as received
//! (streamed or whole), over OpenAI chat or Anthropic Messages
//! ([`crate::conversation`]). A sub-agent ([`Fork`]) plays on a copy of its parent's
//! history after the parent's turn it branches from; the parent goes on after
//! it. With several gateway replicas every request goes to the next one in
//! turn, as a round-robin balancer in front of them would send it. This is the
//! open loop ([`drive`]); [`crate::closed`] drives the same sessions with a
//! fixed number of clients, through [`play`], and [`crate::run`] picks one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kvgate_sim::block_text;
use kvgate_simulate::trace::TRACE_BLOCK_TOKENS;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{self, Outcome};
use crate::conversation::{Conversation, streaming};
use crate::density::Density;
use crate::regime::Api;
use crate::workload::{Content, Fork, Session, Turn};

/// One request as the client saw it.
#[derive(Clone, Debug)]
pub struct Record {
    /// Real time since the run began at which it was sent.
    pub sent: Duration,
    /// Its turn in its session, from 0.
    pub turn: usize,
    /// The chain of requests it belongs to, each sent after the previous one
    /// answered: its session in the open loop, its client in the closed.
    pub chain: usize,
    /// Simulated time at which its chain started (its session's start in
    /// the open loop, 0 in the closed).
    pub chain_start: Duration,
    /// The think time it waited after the previous answer (simulated; 0 in
    /// the closed loop).
    pub think: Duration,
    /// Its TTFT and end-to-end time on the instance's clock (simulated
    /// seconds), when the instance's log has it ([`crate::run`] fills it).
    pub engine: Option<(f64, f64)>,
    pub outcome: Outcome,
    /// The path and body sent, when the run records them (for the ceiling pass).
    pub body: Option<(&'static str, Bytes)>,
}

/// Where and how to send.
#[derive(Clone)]
pub struct Target {
    pub client: reqwest::Client,
    /// Base URL of each gateway replica, `http://127.0.0.1:PORT`.
    pub bases: Arc<[String]>,
    /// The round-robin balancer's position, shared by every session.
    pub next: Arc<AtomicUsize>,
    /// The `model` every body names (it selects the gateway endpoint).
    pub model: String,
    /// Real seconds per simulated second.
    pub time_scale: f64,
    pub record_bodies: bool,
    /// `stream: true` (and usage in the last chunk) or a whole JSON answer.
    pub stream: bool,
    /// The API chat sessions speak.
    pub api: Api,
    /// The text density; trace prompts, built here, are recoded to it.
    pub density: Density,
}

impl Target {
    /// The gateway the next request goes to.
    fn base(&self) -> &str {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.bases
            .get(n % self.bases.len().max(1))
            .map_or("", String::as_str)
    }
}

/// Run every session at its own start time (open loop); returns the records
/// in no particular order.
pub async fn drive(target: &Target, sessions: &[Session]) -> Vec<Record> {
    let t0 = Instant::now();
    let mut tasks = JoinSet::new();
    for (chain, session) in sessions.iter().enumerate() {
        let target = target.clone();
        let session = session.clone();
        let at = t0 + scale(session.start, target.time_scale);
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let mut records = play(&target, chain, &session, t0, true).await;
            for r in &mut records {
                (r.chain, r.chain_start) = (chain, session.start);
            }
            records
        });
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(mut r) = done {
            records.append(&mut r);
        }
    }
    records
}

/// Play one session (`id`: its index in the workload) and its sub-agents,
/// one request at a time; `think`: wait each turn's think time first (open
/// loop) or not (closed loop).
pub async fn play(
    target: &Target,
    id: usize,
    session: &Session,
    t0: Instant,
    think: bool,
) -> Vec<Record> {
    let session_id = format!("kvgate-bench-session-{id}");
    let mut history = Conversation::new(target.api, session.system.clone(), session_id);
    let mut records = Vec::with_capacity(session.turns.len());
    for (index, turn) in session.turns.iter().enumerate() {
        if !one(target, &mut history, turn, index, t0, think, &mut records).await {
            break; // a conversation cannot go on without its answer
        }
        for fork in session.forks.iter().filter(|f| f.after == index) {
            sub_agent(target, &history, fork, t0, think, &mut records).await;
        }
    }
    records
}

/// A sub-agent's turns on a copy of its parent's history.
async fn sub_agent(
    target: &Target,
    parent: &Conversation,
    fork: &Fork,
    t0: Instant,
    think: bool,
    records: &mut Vec<Record>,
) {
    let mut history = parent.clone();
    for (i, turn) in fork.turns.iter().enumerate() {
        let index = fork.after + 1 + i;
        if !one(target, &mut history, turn, index, t0, think, records).await {
            break;
        }
    }
}

/// Send one turn and record it; whether it succeeded.
async fn one(
    target: &Target,
    history: &mut Conversation,
    turn: &Turn,
    index: usize,
    t0: Instant,
    think: bool,
    records: &mut Vec<Record>,
) -> bool {
    if think && !turn.think.is_zero() {
        tokio::time::sleep(scale(turn.think, target.time_scale)).await;
    }
    let (path, body, chat) = request(target, history, turn);
    let body = Bytes::from(body);
    let url = format!("{}{path}", target.base());
    let sent = t0.elapsed();
    let api = if path == "/v1/messages" {
        Api::Messages
    } else {
        Api::OpenAi
    };
    let outcome = client::send(&target.client, &url, body.clone(), chat, target.stream, api).await;
    let ok = outcome.error.is_none();
    if chat {
        // The engine answers in English-like words whatever the density; the
        // history carries them at the cell's density, so a resent answer is
        // as many tokens as at 4 (answers are never cached, so no sharing
        // changes).
        history.answer(&target.density.recode(&outcome.text));
    }
    records.push(Record {
        sent,
        turn: index,
        chain: 0,
        chain_start: Duration::ZERO,
        think: if think { turn.think } else { Duration::ZERO },
        engine: None,
        outcome,
        body: target.record_bodies.then_some((path, body)),
    });
    ok
}

/// The path, body and whether it is chat (whose answer joins the history).
fn request(
    target: &Target,
    history: &mut Conversation,
    turn: &Turn,
) -> (&'static str, Vec<u8>, bool) {
    match &turn.content {
        Content::Chat(user) | Content::ToolResult(user) => {
            history.user(user, matches!(turn.content, Content::ToolResult(_)));
            let (path, body) = history.request(&target.model, turn.max_tokens, target.stream);
            (path, body.to_string().into_bytes(), true)
        }
        Content::Trace { hash_ids, tokens } => {
            let body = json!({
                "model": target.model,
                "prompt": target.density.recode(&trace_prompt(hash_ids, *tokens)),
                "max_tokens": turn.max_tokens,
            });
            let body = streaming(body, target.stream);
            ("/v1/completions", body.to_string().into_bytes(), false)
        }
    }
}

/// `block_text(id, 512)` for each id, cut to `tokens` simulated tokens.
pub fn trace_prompt(hash_ids: &[u64], tokens: usize) -> String {
    let mut out = String::with_capacity(tokens * kvgate_sim::BYTES_PER_TOKEN);
    for &id in hash_ids {
        out.push_str(&block_text(id, TRACE_BLOCK_TOKENS));
        if out.len() >= tokens * kvgate_sim::BYTES_PER_TOKEN {
            break;
        }
    }
    out.truncate(tokens * kvgate_sim::BYTES_PER_TOKEN);
    out
}

/// Real duration of a simulated one.
pub fn scale(simulated: Duration, time_scale: f64) -> Duration {
    Duration::try_from_secs_f64(simulated.as_secs_f64() * time_scale).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_prompts_share_exactly_the_common_blocks() {
        let a = trace_prompt(&[1, 2, 3], 1_200);
        let b = trace_prompt(&[1, 2, 4], 1_500);
        assert_eq!(a.len(), 4_800);
        assert_eq!(b.len(), 6_000);
        assert_eq!(a[..4_096], b[..4_096]);
        assert_ne!(a[4_096..4_200], b[4_096..4_200]);
        // A short prompt is cut inside its first block.
        assert_eq!(trace_prompt(&[1], 10).len(), 40);
    }
}
