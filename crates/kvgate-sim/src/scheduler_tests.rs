//! Step-by-step tests of the scheduler's cache and timing model, in simulated time.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::*;

type Log = Rc<RefCell<Vec<(usize, Event)>>>;

struct TestSink {
    id: usize,
    log: Log,
    closed: Rc<Cell<bool>>,
}

impl SeqSink for TestSink {
    fn is_closed(&self) -> bool {
        self.closed.get()
    }
    fn event(&mut self, event: Event) {
        self.log.borrow_mut().push((self.id, event));
    }
}

struct Bench {
    s: Scheduler<TestSink>,
    log: Log,
    /// (time, sequence, event), in order.
    seen: Vec<(Duration, usize, Event)>,
    counters: Arc<Counters>,
}

fn cfg() -> SimConfig {
    SimConfig {
        block_size: 16,
        cache_blocks: 10_000,
        prefill_tokens_per_s: 1_000.0,
        inter_token_latency: Duration::from_millis(10),
        max_running: 8,
        max_batched_tokens: 8_192,
        ..SimConfig::default()
    }
}

impl Bench {
    fn new(cfg: SimConfig) -> Self {
        let counters = Arc::new(Counters::default());
        Self {
            s: Scheduler::new(&cfg.normalized(), counters.clone()),
            log: Log::default(),
            seen: Vec::new(),
            counters,
        }
    }

    /// Submit a prompt of `tokens` whose first `shared` tokens are common to every
    /// sequence and the rest unique to `id`; returns the handle that closes it.
    fn submit(
        &mut self,
        id: usize,
        shared: usize,
        tokens: usize,
        max_tokens: usize,
    ) -> Rc<Cell<bool>> {
        let mut prompt = vec![b's'; shared * 4];
        prompt.extend((0..(tokens - shared) * 4).map(|i| (i as u8) ^ (id as u8 + 1)));
        let hashes = crate::tokens::block_hashes(&prompt, 16, None);
        let closed = Rc::new(Cell::new(false));
        let sink = TestSink {
            id,
            log: self.log.clone(),
            closed: closed.clone(),
        };
        let spec = SeqSpec {
            serial: 0,
            hashes,
            prompt_tokens: tokens,
            max_tokens,
            kv: None,
        };
        self.s.submit(spec, sink, self.s.now());
        closed
    }

    fn drain(&mut self) {
        let now = self.s.now();
        self.seen
            .extend(self.log.borrow_mut().drain(..).map(|(id, e)| (now, id, e)));
    }

    /// Run one step; false when idle.
    fn step(&mut self) -> bool {
        let Some(d) = self.s.plan() else {
            return false;
        };
        self.drain();
        self.s.finish(d);
        self.drain();
        true
    }

    fn run(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                return;
            }
        }
        panic!("scheduler never went idle");
    }

    fn first_token(&self, id: usize) -> Duration {
        self.seen
            .iter()
            .find(|(_, i, e)| *i == id && matches!(e, Event::Tokens { .. }))
            .map(|(t, ..)| *t)
            .expect("no first token")
    }

    /// Cached tokens at `id`'s latest admission.
    fn cached(&self, id: usize) -> usize {
        self.seen
            .iter()
            .rev()
            .find_map(|(_, i, e)| match e {
                Event::Admitted { cached_tokens } if *i == id => Some(*cached_tokens),
                _ => None,
            })
            .expect("never admitted")
    }

    fn stats(&self) -> crate::SimStats {
        self.counters.snapshot()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn shared_prefix_hit_skips_prefill() {
    let mut b = Bench::new(cfg());
    b.submit(0, 1_000, 1_040, 2);
    b.run();
    let t0 = b.s.now();
    b.submit(1, 1_000, 1_040, 2);
    b.run();
    assert_eq!(b.cached(0), 0);
    assert_eq!(b.first_token(0), ms(1_040), "cold: 1,040 tokens at 1,000/s");
    assert!(b.cached(1) >= 992, "cached {}", b.cached(1));
    let warm = b.first_token(1) - t0;
    assert_eq!(warm, ms(48), "warm: only the 48 uncached tokens");
    let st = b.stats();
    assert_eq!((st.queries_tokens, st.cached_tokens), (2_080, 992));
    assert_eq!(st.generation_tokens, 4);
}

#[test]
fn fully_cached_prompt_still_recomputes_its_last_block() {
    let mut b = Bench::new(cfg());
    b.submit(0, 320, 320, 1);
    b.run();
    b.submit(1, 320, 320, 1);
    b.run();
    assert_eq!(b.cached(1), 304);
}

#[test]
fn concurrent_cold_requests_do_not_hit_blocks_still_being_computed() {
    let mut b = Bench::new(SimConfig {
        max_batched_tokens: 1_500,
        ..cfg()
    });
    b.submit(0, 2_000, 2_000, 1);
    assert!(b.step()); // 1,500 of 0's 2,000 tokens
    b.submit(1, 2_000, 2_000, 1);
    b.run();
    // 1 is admitted beside 0's last chunk: only the 93 blocks computed by then hit.
    assert_eq!(b.cached(1), 93 * 16);
}

#[test]
fn chunked_prefill_spreads_a_long_prompt_over_budgeted_steps() {
    let mut b = Bench::new(cfg());
    b.submit(0, 0, 20_000, 1);
    let steps: Vec<Duration> = std::iter::from_fn(|| {
        let d = b.s.plan()?;
        b.s.finish(d);
        Some(d)
    })
    .collect();
    assert_eq!(
        steps,
        vec![ms(8_192), ms(8_192), ms(3_616)],
        "1,000 tokens/s"
    );
}

#[test]
fn decode_steps_last_one_inter_token_latency_and_stretch_under_prefill() {
    let mut b = Bench::new(SimConfig {
        prefill_tokens_per_s: 100_000.0,
        ..cfg()
    });
    b.submit(0, 0, 100, 5);
    let d1 = b.s.plan().unwrap();
    assert_eq!(d1, ms(10), "100 tokens at 100k/s is under one ITL");
    b.s.finish(d1);
    assert_eq!(b.s.plan(), Some(ms(10)), "pure decode step");
    b.s.finish(ms(10));
    b.submit(1, 0, 5_000, 1);
    // 1 decode token + 5,000 prefill tokens: compute-bound.
    assert_eq!(b.s.plan(), Some(Duration::from_micros(50_010)));
}

#[test]
fn queueing_beyond_max_running_grows_ttft() {
    let mut b = Bench::new(SimConfig {
        max_running: 1,
        ..cfg()
    });
    b.submit(0, 0, 500, 20);
    b.submit(1, 0, 500, 20);
    assert!(b.step());
    assert_eq!((b.stats().running, b.stats().waiting), (1, 1));
    b.run();
    assert_eq!(b.first_token(0), ms(500));
    // 1 waits for 0's prefill and 19 more decode steps, then its own prefill.
    assert_eq!(b.first_token(1), ms(500 + 19 * 10 + 500));

    let mut parallel = Bench::new(SimConfig {
        max_running: 2,
        ..cfg()
    });
    parallel.submit(0, 0, 500, 20);
    parallel.submit(1, 0, 500, 20);
    parallel.run();
    assert_eq!(
        parallel.first_token(1),
        ms(1_000),
        "both prefilled in one step"
    );
}

#[test]
fn kv_shortage_blocks_the_queue_head_until_blocks_free_up() {
    // 40 blocks: a 500-token prompt with 20 output tokens needs 33.
    let mut b = Bench::new(SimConfig {
        cache_blocks: 40,
        ..cfg()
    });
    b.submit(0, 0, 500, 20);
    b.submit(1, 0, 500, 20);
    assert!(b.step());
    assert_eq!((b.stats().running, b.stats().waiting), (1, 1));
    assert_eq!(b.stats().kv_blocks_in_use, 33);
    b.run();
    assert_eq!(b.first_token(1), ms(500 + 19 * 10 + 500));
    // 1's prompt evicted 0's unshared blocks; 0's prefix would miss now.
    b.submit(0, 0, 500, 1);
    b.run();
    assert!(b.cached(0) < 500 - 16, "cached {}", b.cached(0));
}

#[test]
fn abort_frees_the_running_slot_and_its_blocks() {
    let mut b = Bench::new(SimConfig {
        max_running: 1,
        ..cfg()
    });
    let close0 = b.submit(0, 0, 500, 1_000);
    let close2 = b.submit(2, 0, 500, 5);
    b.submit(1, 0, 500, 5);
    assert!(b.step());
    assert!(b.step());
    close0.set(true);
    close2.set(true);
    assert!(b.step());
    let st = b.stats();
    assert_eq!(st.aborted, 2, "one running, one waiting");
    assert_eq!((st.running, st.waiting), (1, 0));
    assert_eq!(st.kv_blocks_in_use, 32, "only sequence 1's blocks");
    b.run();
    assert!(b.seen.iter().any(|(_, i, e)| *i == 1
        && *e
            == Event::Tokens {
                generated: 5,
                done: true
            }));
    assert!(!b.seen.iter().any(|(_, i, _)| *i == 2));
    assert_eq!(b.stats().kv_blocks_in_use, 0);
}

#[test]
fn a_sequence_larger_than_the_cache_is_rejected_not_stuck() {
    let mut b = Bench::new(SimConfig {
        cache_blocks: 10,
        ..cfg()
    });
    b.submit(0, 0, 500, 1);
    b.submit(1, 0, 100, 1);
    b.run();
    assert!(
        b.seen
            .iter()
            .any(|(_, i, e)| *i == 0 && *e == Event::Rejected)
    );
    assert_eq!(b.first_token(1), ms(100));
}

#[test]
fn ttft_is_recorded_in_simulated_time() {
    let mut b = Bench::new(cfg());
    b.submit(0, 0, 500, 1);
    b.run();
    let buckets = &b.counters.ttft_buckets;
    assert_eq!(buckets[9].load(Relaxed), 1, "0.5 s lands in le=0.5");
}

#[test]
fn one_partial_prefill_at_a_time_queues_the_next_prefill_behind_it() {
    let one = SimConfig {
        max_batched_tokens: 300,
        max_partial_prefills: Some(1),
        ..cfg()
    };
    let mut b = Bench::new(one.clone());
    b.submit(0, 0, 500, 3);
    b.submit(1, 0, 500, 3);
    assert_eq!(b.s.plan(), Some(ms(300)), "0's first chunk alone");
    assert_eq!((b.stats().running, b.stats().waiting), (1, 1));
    b.s.finish(ms(300));
    // 0's last 200 tokens; 100 tokens of budget left, but 1 still waits.
    assert_eq!(b.s.plan(), Some(ms(200)));
    assert_eq!((b.stats().running, b.stats().waiting), (1, 1));
    b.s.finish(ms(200));
    b.drain();
    b.run();
    assert_eq!(b.first_token(0), ms(500));
    // Then 0's decode token + 299 of 1's, then 0's last decode token + 1's last 201.
    assert_eq!(b.first_token(1), ms(500 + 300 + 202));

    // Unlimited (the default), 1 takes the budget 0 leaves in the second step.
    let mut all = Bench::new(SimConfig {
        max_partial_prefills: None,
        ..one
    });
    all.submit(0, 0, 500, 3);
    all.submit(1, 0, 500, 3);
    let d = all.s.plan().unwrap();
    all.s.finish(d);
    assert_eq!(all.s.plan(), Some(ms(300)), "0's last 200 + 100 of 1's");
    assert_eq!((all.stats().running, all.stats().waiting), (2, 0));
}

#[test]
fn one_partial_prefill_at_a_time_spends_a_step_on_each_short_prompt() {
    let fast = SimConfig {
        prefill_tokens_per_s: 100_000.0,
        ..cfg()
    };
    let first_tokens = |limit: Option<usize>| {
        let mut b = Bench::new(SimConfig {
            max_partial_prefills: limit,
            ..fast.clone()
        });
        for id in 0..4 {
            b.submit(id, 0, 100, 2);
        }
        b.run();
        (0..4).map(|id| b.first_token(id)).collect::<Vec<_>>()
    };
    // 100 tokens at 100k/s is 1 ms, under one 10 ms step.
    assert_eq!(first_tokens(None), vec![ms(10); 4]);
    assert_eq!(first_tokens(Some(1)), vec![ms(10), ms(20), ms(30), ms(40)]);
    assert_eq!(first_tokens(Some(2)), vec![ms(10), ms(10), ms(20), ms(20)]);
}

#[test]
fn partial_prefill_limit_admits_up_to_the_limit_and_looks_up_hits_late() {
    let mut b = Bench::new(SimConfig {
        max_partial_prefills: Some(2),
        ..cfg()
    });
    b.submit(0, 1_000, 1_040, 2);
    b.submit(1, 0, 200, 2);
    b.submit(2, 1_000, 1_040, 2);
    assert_eq!(b.s.plan(), Some(ms(1_240)), "0 and 1 prefill together");
    assert_eq!((b.stats().running, b.stats().waiting), (2, 1));
    b.s.finish(ms(1_240));
    b.drain();
    b.run();
    // 2 was admitted after 0's prefill had computed the shared prefix.
    assert!(b.cached(2) >= 992, "cached {}", b.cached(2));
    assert_eq!(
        b.first_token(2),
        ms(1_240 + 50),
        "2 decode + 48 prefill tokens"
    );
}
