//! Continuous-batching scheduler with chunked prefill, after vLLM V1. Pure: it owns
//! a simulated clock but never sleeps or does I/O, so it is tested step by step.
//!
//! A step is planned, then (after the engine has waited its duration) finished:
//!
//! 1. Sequences whose client went away are dropped and their blocks released.
//! 2. Running sequences, oldest first, take from the step's `max_batched_tokens`
//!    budget: one token each when decoding, the rest of their prompt (or what is
//!    left of the budget) when prefilling.
//! 3. While budget remains, fewer than `max_running` run and fewer than
//!    `max_partial_prefills` are still prefilling, the head of the FIFO waiting
//!    queue is admitted if the KV cache can hold all its blocks (prompt and
//!    `max_tokens` output, reserved up front, so there is no preemption); its
//!    cached prefix is skipped and its first prefill chunk scheduled. A head that
//!    does not fit blocks those behind it, as in vLLM. With
//!    `max_partial_prefills = 1` the instance prefills one request at a time, and
//!    a request's cache hit is looked up when its turn comes.
//! 4. The step lasts `max(inter_token_latency, tokens / prefill_tokens_per_s)`:
//!    decoding is memory-bound (the weights are read once a step, however many
//!    sequences decode), prefill compute-bound, and a mixed step costs whichever
//!    is larger. Decode tokens count towards `tokens` too, which matters only
//!    for very large batches.
//! 5. When the step finishes, a sequence whose prefill completed gets its first
//!    token (TTFT = queueing + its prefill steps), decoding ones one token more;
//!    sequences at `max_tokens` finish and release their blocks.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::cache::KvCache;
use crate::config::SimConfig;
use crate::kv_events::{self, KvEvent, SeqKv};
use crate::stats::{Counters, add};

/// Longest step the model allows; only absurd configurations get near it.
const MAX_STEP: Duration = Duration::from_secs(24 * 3600);

/// KV blocks a sequence needs in all: its prompt and every output token.
pub(crate) fn blocks_needed(block_size: usize, prompt_tokens: usize, max_tokens: usize) -> usize {
    prompt_tokens
        .saturating_add(max_tokens)
        .div_ceil(block_size.max(1))
}

/// What a sequence needs from the cache and the scheduler.
#[derive(Clone, Debug)]
pub(crate) struct SeqSpec {
    /// Chained hashes of the prompt's full blocks.
    pub hashes: Vec<u64>,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    /// What its KV events need; `None` when the instance publishes none.
    pub kv: Option<SeqKv>,
    /// The number in its response's id (`chatcmpl-{name}-{serial}`), under
    /// which [`crate::Latencies`] records it.
    pub serial: u64,
}

/// What happens to a sequence, in order: `Admitted`, then `Tokens` until `done`;
/// or `Rejected` when it can never fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Admitted { cached_tokens: usize },
    Tokens { generated: usize, done: bool },
    Rejected,
}

/// Where a sequence's progress goes (the HTTP response, or a test's log).
pub(crate) trait SeqSink {
    /// The client went away: abort the sequence.
    fn is_closed(&self) -> bool;
    fn event(&mut self, event: Event);
}

struct Seq<S> {
    spec: SeqSpec,
    sink: S,
    /// Simulated time of arrival.
    arrived: Duration,
    /// Private KV blocks: partial last prompt block and output tokens.
    private: usize,
    /// Prompt tokens computed so far (cached ones included).
    computed: usize,
    /// Leading blocks already marked computed in the cache.
    marked: usize,
    generated: usize,
    /// Tokens scheduled in the step being run.
    scheduled: usize,
}

pub(crate) struct Scheduler<S> {
    block_size: usize,
    max_running: usize,
    max_batched_tokens: usize,
    /// Most sequences in prefill at once (`usize::MAX`: no limit).
    max_partial_prefills: usize,
    prefill_tokens_per_s: f64,
    inter_token_latency: Duration,
    cache: KvCache,
    waiting: VecDeque<Seq<S>>,
    running: Vec<Seq<S>>,
    counters: Arc<Counters>,
    /// Simulated time at the end of the last finished step.
    now: Duration,
    /// KV events since the last [`Scheduler::take_kv_events`], when publishing.
    events: Option<Vec<KvEvent>>,
}

impl<S: SeqSink> Scheduler<S> {
    /// `cfg` must be normalized.
    pub(crate) fn new(cfg: &SimConfig, counters: Arc<Counters>) -> Self {
        counters.kv_total.store(cfg.cache_blocks, Relaxed);
        let mut cache = KvCache::new(cfg.cache_blocks);
        let events = cfg.kv_events.as_ref().map(|_| {
            cache.record_evictions();
            Vec::new()
        });
        Self {
            block_size: cfg.block_size,
            max_running: cfg.max_running,
            max_batched_tokens: cfg.max_batched_tokens,
            max_partial_prefills: cfg.max_partial_prefills.unwrap_or(usize::MAX),
            prefill_tokens_per_s: cfg.prefill_tokens_per_s,
            inter_token_latency: cfg.inter_token_latency,
            cache,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters,
            now: Duration::ZERO,
            events,
        }
    }

    /// The KV events of the steps since the last call, in order (see `kv_events`).
    pub(crate) fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Empty the KV cache without events, as a restarted instance starts.
    pub(crate) fn forget_cache(&mut self) {
        self.cache.forget_cached();
        self.take_kv_events();
    }

    /// Simulated time now.
    pub(crate) fn now(&self) -> Duration {
        self.now
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Queue a sequence that arrived at simulated time `arrived`.
    pub(crate) fn submit(&mut self, mut spec: SeqSpec, sink: S, arrived: Duration) {
        spec.prompt_tokens = spec.prompt_tokens.max(1);
        spec.max_tokens = spec.max_tokens.max(1);
        let total = blocks_needed(self.block_size, spec.prompt_tokens, spec.max_tokens);
        let private = total.saturating_sub(spec.hashes.len());
        self.waiting.push_back(Seq {
            spec,
            sink,
            arrived: arrived.min(self.now),
            private,
            computed: 0,
            marked: 0,
            generated: 0,
            scheduled: 0,
        });
        self.publish();
    }

    /// Plan the next step; returns its simulated duration, or `None` when idle.
    pub(crate) fn plan(&mut self) -> Option<Duration> {
        self.reap_closed();
        let mut budget = self.max_batched_tokens;
        let mut tokens = 0;
        // Sequences holding a prefill slot: admitted, prompt not yet computed.
        let mut prefilling = 0;
        for seq in &mut self.running {
            let left = seq.spec.prompt_tokens.saturating_sub(seq.computed);
            seq.scheduled = if left == 0 {
                budget.min(1)
            } else if prefilling < self.max_partial_prefills {
                prefilling += 1;
                left.min(budget)
            } else {
                // Admission never lets more than the limit in; should one get past it,
                // it waits here for a slot instead.
                0
            };
            budget -= seq.scheduled;
            tokens += seq.scheduled;
        }
        while budget > 0
            && self.running.len() < self.max_running
            && prefilling < self.max_partial_prefills
        {
            let Some(head) = self.waiting.front() else {
                break;
            };
            let spec = &head.spec;
            // vLLM recomputes at least the last prompt token, to get its logits.
            let max_hit = (spec.prompt_tokens - 1) / self.block_size;
            let Some(hit) = self.cache.try_acquire(&spec.hashes, head.private, max_hit) else {
                if self.running.is_empty() {
                    // Even an empty cache cannot hold it; the server refuses such
                    // requests before they get here, so this is only a safeguard.
                    if let Some(mut seq) = self.waiting.pop_front() {
                        seq.sink.event(Event::Rejected);
                    }
                    continue;
                }
                break;
            };
            if let Some(events) = self.events.as_mut() {
                let hashes = self.cache.take_evicted();
                if !hashes.is_empty() {
                    events.push(KvEvent::Removed { hashes });
                }
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            let cached = hit * self.block_size;
            add(&self.counters.queries_tokens, seq.spec.prompt_tokens);
            add(&self.counters.cached_tokens, cached);
            seq.computed = cached;
            seq.marked = hit;
            seq.sink.event(Event::Admitted {
                cached_tokens: cached,
            });
            seq.scheduled = (seq.spec.prompt_tokens - cached).min(budget);
            budget -= seq.scheduled;
            tokens += seq.scheduled;
            prefilling += 1;
            self.running.push(seq);
        }
        self.publish();
        (tokens > 0).then(|| self.step_time(tokens))
    }

    /// Simulated duration of a step that processes `tokens` tokens.
    pub(crate) fn step_time(&self, tokens: usize) -> Duration {
        // Whole nanoseconds, so that round figures stay exact; `as` saturates.
        let nanos = (tokens as f64 * 1e9 / self.prefill_tokens_per_s).round();
        let compute = Duration::from_nanos(nanos as u64);
        compute.max(self.inter_token_latency).min(MAX_STEP)
    }

    /// Finish the planned step, which lasted `duration`: advance the clock, emit
    /// tokens, retire finished sequences.
    pub(crate) fn finish(&mut self, duration: Duration) {
        self.now = self.now.saturating_add(duration);
        let (now, block_size) = (self.now, self.block_size);
        let (counters, cache) = (&self.counters, &mut self.cache);
        let events = &mut self.events;
        self.running.retain_mut(|seq| {
            if seq.scheduled == 0 {
                return true;
            }
            let prompt = seq.spec.prompt_tokens;
            if seq.computed < prompt {
                seq.computed = (seq.computed + seq.scheduled).min(prompt);
                let full = (seq.computed / block_size).min(seq.spec.hashes.len());
                kv_events::mark_computed(
                    cache,
                    &seq.spec.hashes,
                    seq.marked..full,
                    seq.spec.kv.as_ref(),
                    events.as_mut(),
                    block_size,
                );
                seq.marked = seq.marked.max(full);
                if seq.computed == prompt {
                    seq.generated = 1;
                    counters.observe_ttft(seq.spec.serial, now.saturating_sub(seq.arrived));
                }
            } else {
                seq.generated += 1;
            }
            seq.scheduled = 0;
            if seq.generated == 0 {
                return true;
            }
            add(&counters.generation_tokens, 1);
            let done = seq.generated >= seq.spec.max_tokens;
            seq.sink.event(Event::Tokens {
                generated: seq.generated,
                done,
            });
            if done {
                cache.release(&seq.spec.hashes, seq.private);
                counters.observe_done(seq.spec.serial, now.saturating_sub(seq.arrived));
            }
            !done
        });
        self.publish();
    }

    fn reap_closed(&mut self) {
        let (counters, cache) = (&self.counters, &mut self.cache);
        self.running.retain(|seq| {
            let closed = seq.sink.is_closed();
            if closed {
                cache.release(&seq.spec.hashes, seq.private);
                counters.aborted.fetch_add(1, Relaxed);
            }
            !closed
        });
        self.waiting.retain(|seq| {
            let closed = seq.sink.is_closed();
            if closed {
                counters.aborted.fetch_add(1, Relaxed);
            }
            !closed
        });
    }

    fn publish(&self) {
        self.counters.running.store(self.running.len(), Relaxed);
        self.counters.waiting.store(self.waiting.len(), Relaxed);
        self.counters.kv_in_use.store(self.cache.in_use(), Relaxed);
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
