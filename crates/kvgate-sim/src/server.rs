//! `SimServer`: one instance's shared state (config, counters, the engine's inbox)
//! and the admission of parsed requests into its engine.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::config::SimConfig;
use crate::engine::{self, EngineSink, Inbox, Progress, Submission};
use crate::error::ApiError;
use crate::kv_events::{KvControls, KvSink, SeqKv};
use crate::request::{Api, Job};
use crate::response::Meta;
use crate::scheduler::{Scheduler, SeqSpec, blocks_needed};
use crate::stats::{Counters, Latencies, SimStats, add};
use crate::tokens::token_block_hashes;

/// One simulated vLLM instance: KV cache, scheduler and counters behind an HTTP API.
pub struct SimServer {
    pub(crate) cfg: SimConfig,
    /// Prompt bytes a simulated token (`cfg.bytes_per_token`).
    pub(crate) tokens: crate::tokens::TokenBytes,
    pub(crate) counters: Arc<Counters>,
    tx: mpsc::UnboundedSender<Inbox>,
    /// The engine, until the first request starts it inside the serving runtime
    /// (so `new` works outside a runtime too).
    pending: Mutex<Option<(Scheduler<EngineSink>, mpsc::UnboundedReceiver<Inbox>)>>,
    started: OnceLock<()>,
    next_id: AtomicU64,
    kv_controls: Arc<KvControls>,
    /// The KV-event publisher, once [`crate::spawn`] has bound its sockets.
    kv_sink: OnceLock<KvSink>,
    /// Responses API conversations stored here (vLLM keeps them per instance).
    pub(crate) responses: Arc<crate::response_store::Store>,
}

/// A request accepted by the engine.
pub(crate) struct Accepted {
    pub meta: Meta,
    pub rx: watch::Receiver<Progress>,
    pub prompt_tokens: usize,
}

impl SimServer {
    /// Build an instance; out-of-range config values are clamped (see [`SimConfig`]).
    /// Its engine task starts with the first request and ends once the server and
    /// its routers are dropped and the last sequence has finished.
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        let cfg = cfg.normalized();
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let sched = Scheduler::new(&cfg, counters.clone());
        Arc::new(Self {
            tokens: cfg.token_bytes(),
            cfg,
            counters,
            tx,
            pending: Mutex::new(Some((sched, rx))),
            started: OnceLock::new(),
            next_id: AtomicU64::new(0),
            kv_controls: Arc::default(),
            kv_sink: OnceLock::new(),
            responses: Arc::default(),
        })
    }

    /// The next `n` KV-event batches get their seq and go into the replay buffer
    /// but are not sent on PUB, so a subscriber sees a gap (replaces any count left).
    pub fn drop_kv_batches(&self, n: usize) {
        self.kv_controls.drop_batches(n);
    }

    /// While `silent`, no KV event is published or buffered (a silent publisher);
    /// the cache works as ever.
    pub fn silence_kv_events(&self, silent: bool) {
        self.kv_controls.silence(silent);
    }

    /// Look like a restarted vLLM to KV-event subscribers: the KV cache is emptied
    /// without events, the seq restarts at 0 and the replay buffer is emptied.
    /// Returns once done. Sequences running meanwhile keep running, but their
    /// blocks no longer serve hits.
    pub async fn restart_kv_publisher(&self) {
        self.start_engine();
        let (ack, done) = oneshot::channel();
        if self.tx.send(Inbox::RestartKv(ack)).is_ok() {
            let _ = done.await;
        }
    }

    /// Connect the engine to the publisher task; before the first request only.
    pub(crate) fn attach_kv_publisher(&self, tx: mpsc::UnboundedSender<crate::kv_events::PubMsg>) {
        let _ = self.kv_sink.set(KvSink::new(tx, self.kv_controls.clone()));
    }

    /// The configuration in effect (after clamping).
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SimStats {
        self.counters.snapshot()
    }

    /// Every request's TTFT and end-to-end time so far (simulated seconds).
    pub fn latencies(&self) -> Latencies {
        self.counters.latencies()
    }

    /// Tokenize, hash and queue a parsed request. Must run inside a tokio runtime.
    pub(crate) fn submit(&self, job: &Job) -> Result<Accepted, ApiError> {
        let prompt_tokens = job
            .token_ids
            .as_ref()
            .map_or_else(|| self.tokens.count(&job.prompt), Vec::len);
        let max_tokens = job.max_tokens.map_or(self.cfg.default_max_tokens, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        });
        let needed = blocks_needed(self.cfg.block_size, prompt_tokens, max_tokens);
        if needed > self.cfg.cache_blocks {
            let msg = format!(
                "this request needs {needed} KV blocks ({prompt_tokens} prompt tokens + {max_tokens} \
                 output tokens, {} a block) but the instance holds {}; shorten the prompt or lower max_tokens",
                self.cfg.block_size, self.cfg.cache_blocks
            );
            return Err(ApiError::bad_request(msg, Some("max_tokens")));
        }
        let (block_size, salt) = (self.cfg.block_size, job.cache_salt.as_deref());
        let hashes = match &job.token_ids {
            Some(ids) => token_block_hashes(ids, block_size, salt),
            None => self.tokens.block_hashes(&job.prompt, block_size, salt),
        };
        let kv = self.cfg.kv_events.as_ref().map(|_| {
            let full = hashes.len() * block_size;
            SeqKv {
                token_ids: match &job.token_ids {
                    Some(ids) => ids.get(..full).unwrap_or_default().to_vec(),
                    None => self.tokens.chunk_ids(&job.prompt, full),
                },
                cache_salt: salt.map(Into::into),
            }
        });
        let meta = self.meta(job);
        let spec = SeqSpec {
            hashes,
            prompt_tokens,
            max_tokens,
            kv,
            serial: meta.serial,
        };
        let (sink, rx) = EngineSink::new(job.stream);
        self.start_engine();
        let sub = Submission {
            spec,
            sink,
            arrived: Instant::now(),
        };
        if self.tx.send(Inbox::Submit(sub)).is_err() {
            return Err(ApiError::unavailable("the engine has stopped"));
        }
        self.counters.requests.fetch_add(1, Relaxed);
        add(&self.counters.prompt_tokens, prompt_tokens);
        Ok(Accepted {
            meta,
            rx,
            prompt_tokens,
        })
    }

    fn start_engine(&self) {
        self.started.get_or_init(|| {
            let parts = self.pending.lock().ok().and_then(|mut p| p.take());
            if let Some((sched, rx)) = parts {
                let kv = self.kv_sink.get().cloned();
                tokio::spawn(engine::run(sched, rx, self.cfg.time_scale, kv));
            }
        });
    }

    fn meta(&self, job: &Job) -> Meta {
        let n = self.next_id.fetch_add(1, Relaxed);
        let prefix = match job.api {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
        };
        Meta {
            serial: n,
            api: job.api,
            id: format!("{prefix}-{}-{n}", self.cfg.name),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: job.model.clone().unwrap_or_else(|| self.cfg.model.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn job(prompt: &[u8], max_tokens: u64) -> Job {
        Job {
            api: Api::Chat,
            prompt: prompt.to_vec(),
            token_ids: None,
            max_tokens: Some(max_tokens),
            stream: true,
            include_usage: false,
            cache_salt: None,
            model: None,
        }
    }

    /// With tokio time paused, the engine's sleeps are exactly the model's steps × time_scale.
    #[tokio::test(start_paused = true)]
    async fn engine_waits_exactly_the_modelled_time() {
        let s = SimServer::new(SimConfig {
            prefill_tokens_per_s: 1_000.0,
            inter_token_latency: Duration::from_millis(10),
            time_scale: 0.5,
            ..SimConfig::default()
        });
        let prompt = vec![b'a'; 4_000]; // 1,000 tokens
        let start = Instant::now();
        let mut cold = s.submit(&job(&prompt, 3)).unwrap();
        cold.rx.wait_for(|p| p.generated == 1).await.unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(500),
            "1 s of prefill at half scale"
        );
        cold.rx.wait_for(|p| p.done).await.unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(510),
            "then 2 decode steps"
        );

        let start = Instant::now();
        let mut warm = s.submit(&job(&prompt, 1)).unwrap();
        let p = *warm.rx.wait_for(|p| p.done).await.unwrap();
        assert_eq!(p.cached_tokens, 992);
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(5),
            "one ITL-bound step"
        );
        let st = s.stats();
        assert_eq!(
            (st.requests, st.cached_tokens, st.generation_tokens),
            (2, 992, 4)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_receiver_aborts_at_the_next_step() {
        let s = SimServer::new(SimConfig {
            time_scale: 1.0,
            ..SimConfig::default()
        });
        let mut a = s.submit(&job(&[b'x'; 400], 100_000)).unwrap();
        a.rx.wait_for(|p| p.generated == 2).await.unwrap();
        assert_eq!(s.stats().running, 1);
        drop(a);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let st = s.stats();
        assert_eq!((st.aborted, st.running, st.kv_blocks_in_use), (1, 0, 0));
    }

    /// At 2 bytes a token the same prompt is twice the tokens and blocks:
    /// usage, cached tokens and the KV capacity it needs all follow.
    #[tokio::test(start_paused = true)]
    async fn two_bytes_a_token_doubles_prompt_and_cached_tokens() {
        let s = SimServer::new(SimConfig {
            bytes_per_token: 2.0,
            time_scale: 0.0,
            ..SimConfig::default()
        });
        let prompt = vec![b'a'; 4_000];
        let mut cold = s.submit(&job(&prompt, 1)).unwrap();
        assert_eq!(cold.prompt_tokens, 2_000, "1,000 at 4 bytes a token");
        cold.rx.wait_for(|p| p.done).await.unwrap();
        let mut warm = s.submit(&job(&prompt, 1)).unwrap();
        let p = *warm.rx.wait_for(|p| p.done).await.unwrap();
        assert_eq!(p.cached_tokens, 1_984, "124 full blocks, not 62");
        let small = SimServer::new(SimConfig {
            bytes_per_token: 2.0,
            cache_blocks: 10,
            ..SimConfig::default()
        });
        let err = small.submit(&job(&[b'x'; 4 * 75], 20)).err().unwrap();
        assert!(
            err.message.contains("needs 11 KV blocks"),
            "{}",
            err.message
        );
    }

    #[tokio::test]
    async fn oversized_requests_are_refused_before_the_engine() {
        let s = SimServer::new(SimConfig {
            cache_blocks: 10,
            ..SimConfig::default()
        });
        let err = s.submit(&job(&[b'x'; 4 * 150], 20)).err().unwrap();
        assert_eq!(err.status, 400);
        assert!(
            err.message.contains("needs 11 KV blocks"),
            "{}",
            err.message
        );
        assert!(
            s.submit(&job(&[b'x'; 4 * 150], 10)).is_ok(),
            "160 tokens fit 10 blocks"
        );
        assert_eq!(s.stats().requests, 1);
    }
}
