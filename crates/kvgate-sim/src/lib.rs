//! A simulated vLLM model server, faithful where prefix routing matters: its KV
//! prefix cache, its continuous-batching scheduler and the time to first token
//! (TTFT) that follows from them. It serves vLLM's HTTP API (OpenAI chat and
//! completions, streaming or not, Anthropic Messages (`/v1/messages`, converted
//! to a chat request as vLLM converts it, see `messages/`), SageMaker
//! `/invocations`, `/ping`, `/health`, `/v1/models`, and `/metrics` under vLLM's
//! metric names), so kvgate's demo, integration tests and load benchmark can run
//! a fleet of them in one process.
//!
//! # The model
//!
//! **Tokens.** By default no real tokenizer: one token is one 4-byte chunk of the
//! prompt (chat messages go through a fixed template first, see `request.rs`), so
//! token identity is that chunk and a prompt of `n` bytes has ⌈n/4⌉ tokens. With
//! `SimConfig::tokenizer` set, tokens are that tokenizer's ids (chat through its
//! chat template) and blocks are hashed over the ids instead.
//!
//! **Blocks and hashes.** Tokens are grouped into blocks of `block_size` (16).
//! Block `i` is keyed by `xxh3(hash(i−1) ‖ its bytes)`; block 0's parent is a
//! fixed root, or a hash of the request's `cache_salt`, so two salts (or salt and
//! no salt) never share a block, as in vLLM. Only full blocks are cached.
//!
//! **KV cache.** `cache_blocks` blocks per instance. A sequence reserves, on
//! admission, its prompt's blocks (sharing those already cached) plus private
//! blocks for its partial last block and its `max_tokens` output. Blocks are
//! ref-counted by running sequences; when a sequence ends its computed blocks stay
//! cached with refcount 0 and are evicted least recently used first (a prompt's
//! tail before its head). A block serves hits only once it has been computed.
//! `cached_tokens` = the longest run of leading blocks cached at admission, capped
//! so at least the last prompt token is recomputed (vLLM needs its logits).
//!
//! **Time.** Each instance runs an engine task with a vLLM V1-style scheduler.
//! Requests wait in a FIFO queue and are admitted while fewer than `max_running`
//! run, fewer than `max_partial_prefills` (when set; vLLM's
//! `--max-num-partial-prefills`) are still prefilling, and the KV cache can hold
//! their blocks. A step processes at most
//! `max_batched_tokens` tokens: one per decoding sequence, the rest for chunked
//! prefill of uncached prompt tokens. A step lasts
//!
//! ```text
//! step = max(inter_token_latency, tokens_in_step / prefill_tokens_per_s) × time_scale
//! ```
//!
//! (decode is memory-bound, one weight read a step; prefill compute-bound; a mixed
//! step costs the larger). A sequence gets its first token at the end of the step
//! that completes its prefill, then one token a step until `max_tokens`. So TTFT
//! = queueing + uncached prefill, emerging from the schedule: an overloaded
//! instance queues and its TTFT grows, a cache hit skips prefill. Responses send
//! their first byte of body (stream) or the whole body (non-stream) only then.
//! The clock is tokio's, so paused-time tests work.
//!
//! **KV events.** With `SimConfig::kv_events` set, `spawn` also binds a ZeroMQ
//! PUB socket and a ROUTER replay socket and publishes `BlockStored` /
//! `BlockRemoved` batches, one per engine step, in vLLM's wire format (see
//! `kv_events/`), so a KV-aware gateway can be tested without a GPU.
//!
//! **Aborts.** A client that goes away drops its response, which the engine sees
//! before its next step: the sequence leaves the scheduler, its blocks are released
//! (cached, evictable) and `aborted` counts it.
//!
//! **Cost.** A request is parsed and hashed once, on its handler's task; the
//! engine does O(running sequences) work a step with no per-token allocation, and
//! wakes each streaming response at most once a step with the latest progress.
//!
//! # Use
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use kvgate_sim::{SimConfig, spawn};
//! let cfg = SimConfig { time_scale: 0.1, ..SimConfig::llama70b_h100_tp4() };
//! let sim = spawn(cfg, "127.0.0.1:0".parse().unwrap()).await?;
//! println!("vLLM-like server at {}", sim.url());
//! # Ok(()) }
//! ```

mod api;
mod cache;
mod config;
mod engine;
mod error;
mod kv_events;
mod messages;
mod metrics;
mod request;
mod response;
mod response_store;
mod responses;
mod scheduler;
mod serve;
mod server;
mod sse;
mod stats;
mod text;
mod tokens;

pub use cache::{BlockHashBuilder, KvCache};
pub use config::SimConfig;
pub use kv_events::{EventEncoding, HashForm, KvEventsConfig};
pub use serve::{SimHandle, spawn, spawn_fleet};
pub use server::SimServer;
pub use stats::{Latencies, SimStats};
pub use text::block_text;
pub use tokens::{BYTES_PER_TOKEN, MAX_BYTES_PER_TOKEN, TokenBytes, block_hashes, count_tokens};
