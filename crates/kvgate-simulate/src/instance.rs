//! One simulated instance in virtual time: kvgate-sim's scheduler rules over
//! kvgate-sim's own [`KvCache`], stepped by the event loop instead of a clock.
//!
//! As in `kvgate_sim` (see its crate docs and `scheduler.rs`): a FIFO queue;
//! admission while fewer than `max_running` run and the cache can hold the
//! prompt's blocks plus private blocks for the partial last block and every
//! output token; steps of at most `max_batched_tokens` (one per decoding
//! sequence, the rest chunked prefill of uncached tokens, oldest first) lasting
//! `max(inter_token_latency, tokens / prefill_tokens_per_s)`; the first token
//! at the end of the step that completes a prefill; blocks released (cached,
//! evictable LRU) when the last token is out.
//!
//! For the gateway's side it also keeps the instance's queued prefill: the
//! charge (`Policy::queued_charge`) of each request dispatched here, held from
//! dispatch until its first token (or its rejection), as the gateway's
//! in-flight guard holds it until the first byte; and the instance's pace as
//! the gateway learns it, each first token a sample and each stream's first
//! decode step its first reading of a step (`kvgate_routing::pace`),
//! so the what-if charges the overhead the live gateway would, and drains
//! the queued charges at the rate it has learned (`kvgate_routing::drain`).
//!
//! The one addition is speed: while every running sequence is decoding, every
//! step is alike, so the run of steps up to the next sequence's last token is
//! taken as one event, cut short at the next step boundary when a request
//! arrives. The result is the same as stepping one by one.

use std::collections::VecDeque;

use kvgate_routing::drain::Drain;
use kvgate_routing::pace::{Ahead, Pace};
use kvgate_sim::{KvCache, SimConfig};

use super::workload::Workload;

/// Output tokens a streamed chat answer needs for the gateway to read the gap
/// between its tokens (eleven events after the first token's, its closing
/// `[DONE]` among them).
const GAP_TOKENS: usize = 11;

/// Capacity and speed of every instance.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Timing {
    pub block_size: usize,
    pub cache_blocks: usize,
    pub prefill_tokens_per_s: f64,
    pub inter_token_latency_s: f64,
    pub max_running: usize,
    pub max_batched_tokens: usize,
}

impl Timing {
    /// kvgate-sim's preset (Llama-3.1-70B, TP 4, H100; documented in `SimConfig`).
    pub fn from_sim(cfg: &SimConfig) -> Self {
        Self {
            block_size: cfg.block_size.max(1),
            cache_blocks: cfg.cache_blocks.max(1),
            prefill_tokens_per_s: cfg.prefill_tokens_per_s.max(1.0),
            inter_token_latency_s: cfg.inter_token_latency.as_secs_f64(),
            max_running: cfg.max_running.max(1),
            max_batched_tokens: cfg.max_batched_tokens.max(1),
        }
    }

    fn step_time(&self, tokens: usize) -> f64 {
        (tokens as f64 / self.prefill_tokens_per_s).max(self.inter_token_latency_s)
    }
}

/// What happened to each request, filled in as the run goes.
#[derive(Debug)]
pub struct Record {
    /// Seconds from arrival to first token; NaN until then (or if rejected).
    pub ttft: Vec<f64>,
    /// Prompt tokens served from cache at admission.
    pub cached: Vec<usize>,
    /// Requests no empty instance could hold.
    pub rejected: usize,
    /// Virtual time of the last token of the run.
    pub end: f64,
}

impl Record {
    pub fn new(requests: usize) -> Self {
        Self {
            ttft: vec![f64::NAN; requests],
            cached: vec![0; requests],
            rejected: 0,
            end: 0.0,
        }
    }
}

#[derive(Debug)]
struct Seq {
    req: usize,
    arrived: f64,
    /// Queued-prefill tokens the gateway charged for it, until its first token.
    charge: u64,
    /// What its first token waits for, as the gateway saw it ([`Pace`]).
    ahead: Ahead,
    /// The part of `charge` that was the instance's overhead.
    overhead: u64,
    prompt: usize,
    max_tokens: usize,
    private: usize,
    computed: usize,
    marked: usize,
    generated: usize,
    scheduled: usize,
}

/// `count` identical steps of `each` seconds from `start` (more than one only
/// while every running sequence decodes).
#[derive(Debug, Clone, Copy)]
struct Step {
    start: f64,
    each: f64,
    count: usize,
}

impl Step {
    fn end(&self) -> f64 {
        self.start + self.each * self.count as f64
    }
}

#[derive(Debug)]
pub struct Instance {
    timing: Timing,
    cache: KvCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    step: Option<Step>,
    /// Sum of the charges of requests without a first token yet.
    queued: u64,
    /// Those requests, and their charges without the overheads.
    queued_requests: u64,
    queued_uncached: u64,
    /// What the gateway believes computed of those uncached tokens.
    drain: Drain,
    /// Its pace as the gateway learns it from first tokens.
    pace: Pace,
}

/// Virtual seconds as the gateway's millisecond clock.
fn ms(t: f64) -> u64 {
    (t.max(0.0) * 1e3) as u64
}

impl Instance {
    pub fn new(timing: Timing) -> Self {
        Self {
            timing,
            cache: KvCache::new(timing.cache_blocks),
            waiting: VecDeque::new(),
            running: Vec::new(),
            step: None,
            queued: 0,
            queued_requests: 0,
            queued_uncached: 0,
            drain: Drain::default(),
            pace: Pace::default(),
        }
    }

    /// What one queued request costs here, as the gateway has learned it
    /// (`Load::overhead_tokens`).
    pub fn overhead_tokens(&self) -> u64 {
        self.pace.overhead_tokens()
    }

    /// Requests dispatched here and not finished: what the gateway counts.
    pub fn in_flight(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Requests dispatched here with no first token yet (`Load::waiting`).
    pub fn queued_requests(&self) -> usize {
        usize::try_from(self.queued_requests).unwrap_or(usize::MAX)
    }

    /// Prefill tokens charged to requests here that have no first token yet,
    /// less what the gateway believes computed of them at `now`: what its
    /// `Load::queued_prefill` reads.
    pub fn queued_prefill(&self, now: f64) -> u64 {
        self.queued.saturating_sub(self.done(now))
    }

    /// Of the queued uncached tokens, those the gateway believes computed.
    fn done(&self, now: f64) -> u64 {
        self.drain.done(ms(now), self.queued_uncached, self.rate())
    }

    fn rate(&self) -> f64 {
        self.pace.tokens_per_s().unwrap_or(0.0)
    }

    /// When the step in progress ends, if one is.
    pub fn step_end(&self) -> Option<f64> {
        self.step.map(|s| s.end())
    }

    /// Request `req` arrives at `now`, charged `charge` queued-prefill tokens
    /// until its first token; it is considered at the next step boundary.
    pub fn submit(&mut self, req: usize, now: f64, charge: u64, w: &Workload, rec: &mut Record) {
        let Some(r) = w.requests.get(req) else { return };
        let bs = self.timing.block_size;
        let total_blocks = (r.prompt_tokens + r.output_tokens).div_ceil(bs);
        let overhead = self.pace.overhead_tokens().min(charge);
        let ahead = Ahead {
            work: self.queued_uncached - self.done(now) + (charge - overhead),
            requests: self.queued_requests,
        };
        if charge > 0 {
            self.drain
                .change(ms(now), self.queued_uncached, self.rate(), 0);
        }
        self.queued_requests += 1;
        self.queued_uncached += charge - overhead;
        self.waiting.push_back(Seq {
            req,
            arrived: now,
            charge,
            ahead,
            overhead,
            prompt: r.prompt_tokens,
            max_tokens: r.output_tokens,
            private: total_blocks.saturating_sub(w.hashes(req).len()),
            computed: 0,
            marked: 0,
            generated: 0,
            scheduled: 0,
        });
        self.queued = self.queued.saturating_add(charge);
        match &mut self.step {
            None => self.plan(now, w, rec),
            Some(s) if s.count > 1 => {
                let boundary = ((now - s.start) / s.each).ceil() as usize;
                s.count = boundary.clamp(1, s.count);
            }
            Some(_) => {}
        }
    }

    /// End the step in progress: emit tokens, retire finished sequences, plan the next.
    pub fn finish(&mut self, w: &Workload, rec: &mut Record) {
        let Some(step) = self.step.take() else { return };
        let now = step.end();
        let bs = self.timing.block_size;
        let cache = &mut self.cache;
        let (queued, pace, drain) = (&mut self.queued, &self.pace, &self.drain);
        let (queued_requests, queued_uncached) =
            (&mut self.queued_requests, &mut self.queued_uncached);
        self.running.retain_mut(|seq| {
            if seq.scheduled == 0 {
                return true;
            }
            if seq.computed < seq.prompt {
                seq.computed = (seq.computed + seq.scheduled).min(seq.prompt);
                let hashes = w.hashes(seq.req);
                let full = (seq.computed / bs).min(hashes.len());
                for &h in hashes.get(seq.marked..full).unwrap_or_default() {
                    cache.mark_computed(h);
                }
                seq.marked = seq.marked.max(full);
                if seq.computed == seq.prompt {
                    seq.generated = 1;
                    rec.ttft[seq.req] = now - seq.arrived;
                    pace.observe(seq.ahead, now - seq.arrived);
                    let charge = std::mem::take(&mut seq.charge);
                    let uncached = charge.saturating_sub(seq.overhead);
                    let rate = pace.tokens_per_s().unwrap_or(0.0);
                    drain.change(ms(now), *queued_uncached, rate, uncached);
                    *queued = queued.saturating_sub(charge);
                    *queued_requests = queued_requests.saturating_sub(1);
                    *queued_uncached =
                        queued_uncached.saturating_sub(charge.saturating_sub(seq.overhead));
                }
            } else {
                if seq.generated == 1 && seq.max_tokens >= GAP_TOKENS {
                    // The gateway's first reading of a step: the gap between
                    // tokens of a stream long enough to tell.
                    pace.observe_gap(step.each);
                }
                seq.generated += step.count;
            }
            seq.scheduled = 0;
            let done = seq.generated >= seq.max_tokens;
            if done {
                cache.release(w.hashes(seq.req), seq.private);
                rec.end = rec.end.max(now);
            }
            !done
        });
        self.plan(now, w, rec);
    }

    /// Plan the step starting at `now`, or go idle.
    fn plan(&mut self, now: f64, w: &Workload, rec: &mut Record) {
        let t = self.timing;
        let mut budget = t.max_batched_tokens;
        let mut tokens = 0;
        for seq in &mut self.running {
            let need = seq.prompt.saturating_sub(seq.computed).max(1);
            seq.scheduled = need.min(budget);
            budget -= seq.scheduled;
            tokens += seq.scheduled;
        }
        while budget > 0 && self.running.len() < t.max_running {
            let Some(head) = self.waiting.front() else {
                break;
            };
            let (hashes, max_hit) = (w.hashes(head.req), w.max_hit(head.req));
            let Some(hit) = self.cache.try_acquire(hashes, head.private, max_hit) else {
                if self.running.is_empty() {
                    // Even an empty cache cannot hold it (kvgate-sim refuses these);
                    // its error answer ends the gateway's charge.
                    if let Some(s) = self.waiting.pop_front() {
                        let uncached = s.charge.saturating_sub(s.overhead);
                        self.drain
                            .change(ms(now), self.queued_uncached, self.rate(), uncached);
                        self.queued = self.queued.saturating_sub(s.charge);
                        self.queued_requests = self.queued_requests.saturating_sub(1);
                        self.queued_uncached = self
                            .queued_uncached
                            .saturating_sub(s.charge.saturating_sub(s.overhead));
                    }
                    rec.rejected += 1;
                    continue;
                }
                break;
            };
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            let cached = hit * t.block_size;
            rec.cached[seq.req] = cached;
            seq.computed = cached;
            seq.marked = hit;
            seq.scheduled = (seq.prompt - cached).min(budget);
            budget -= seq.scheduled;
            tokens += seq.scheduled;
            self.running.push(seq);
        }
        if tokens == 0 {
            self.step = None;
            return;
        }
        // All decoding, none starved: identical steps until the first one finishes.
        let decoding = self
            .running
            .iter()
            .all(|s| s.computed == s.prompt && s.scheduled == 1);
        let count = if decoding {
            self.running
                .iter()
                .map(|s| s.max_tokens.saturating_sub(s.generated))
                .min()
                .unwrap_or(1)
                .max(1)
        } else {
            1
        };
        self.step = Some(Step {
            start: now,
            each: t.step_time(tokens),
            count,
        });
    }
}

#[cfg(test)]
#[path = "instance_tests.rs"]
mod tests;
