//! KV-cache events published over ZeroMQ exactly as vLLM's `ZmqEventPublisher`
//! does, so a gateway's `kv_aware` routing can follow what each simulated
//! instance really holds.
//!
//! The scheduler records a [`KvEvent`] when prefill completes blocks (`BlockStored`,
//! one per run of consecutive newly cached blocks of a sequence) and when the cache
//! evicts (`BlockRemoved`); the engine hands one step's events to a [`KvSink`], which
//! applies the test controls and sends them down a channel to the publisher task
//! (`publisher.rs`), so neither encoding nor socket I/O ever runs on the engine.
//! The wire format lives in `encode.rs`.

mod encode;
mod publisher;
mod record;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

pub(crate) use encode::Wire;
pub(crate) use publisher::{Endpoints, bind};
pub(crate) use record::{SeqKv, mark_computed};

/// How a simulated instance publishes its KV-cache events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// Event layout in the payload.
    pub encoding: EventEncoding,
    /// How block hashes are written.
    pub hashes: HashForm,
    /// Batches kept for replay over the ROUTER socket (vLLM: `buffer_steps`).
    pub replay_buffer: usize,
    /// First frame of every PUB message (vLLM's default: empty).
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            encoding: EventEncoding::Map,
            hashes: HashForm::Int,
            replay_buffer: 10_000,
            topic: String::new(),
        }
    }
}

/// The msgpack shape of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventEncoding {
    /// vLLM ≤ 0.10: msgspec `array_like` structs, tagged by their first element
    /// (`["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]`).
    Array,
    /// Current vLLM: maps with a `"type"` field (and `lora_name`, `extra_keys`).
    Map,
}

/// How a block hash appears on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashForm {
    /// An unsigned 64-bit integer (vLLM's `sha256_cbor_64bit`-style hashing).
    Int,
    /// A signed 64-bit integer, as Python's builtin `hash()` gives.
    SignedInt,
    /// 32 bytes (msgpack bin), as `sha256` block hashing gives.
    Bytes,
}

/// One KV-cache event, before encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KvEvent {
    Stored {
        hashes: Vec<u64>,
        /// Hash of the block before the run; `None` for a prompt's first block.
        parent: Option<u64>,
        /// Token ids of every block of the run, concatenated.
        token_ids: Vec<u32>,
        /// The request's `cache_salt`, when the run starts at its first block.
        salt: Option<Arc<str>>,
    },
    Removed {
        hashes: Vec<u64>,
    },
}

/// Test controls shared by the server (which sets them) and the engine (which reads
/// them as it hands over each batch).
#[derive(Debug, Default)]
pub(crate) struct KvControls {
    /// Batches still to number and buffer but not send on PUB.
    drop_next: AtomicUsize,
    silenced: AtomicBool,
}

impl KvControls {
    pub(crate) fn drop_batches(&self, n: usize) {
        self.drop_next.store(n, Relaxed);
    }

    pub(crate) fn silence(&self, on: bool) {
        self.silenced.store(on, Relaxed);
    }

    /// Whether the next batch is to be dropped (and count it).
    fn take_drop(&self) -> bool {
        self.drop_next
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// What the engine sends the publisher task.
pub(crate) enum PubMsg {
    Batch {
        ts: f64,
        events: Vec<KvEvent>,
        /// False for a batch `drop_kv_batches` makes a gap of.
        send: bool,
    },
    /// Behave like a restarted vLLM: seq back to 0, replay buffer emptied.
    Restart(oneshot::Sender<()>),
}

/// The engine's end of the publisher channel. Never blocks.
#[derive(Clone, Debug)]
pub(crate) struct KvSink {
    tx: mpsc::UnboundedSender<PubMsg>,
    controls: Arc<KvControls>,
}

impl KvSink {
    pub(crate) fn new(tx: mpsc::UnboundedSender<PubMsg>, controls: Arc<KvControls>) -> Self {
        Self { tx, controls }
    }

    /// Hand one engine step's events over; an empty batch is not published.
    pub(crate) fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() || self.controls.silenced.load(Relaxed) {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let send = !self.controls.take_drop();
        // The publisher only goes away with the runtime: nothing left to tell.
        let _ = self.tx.send(PubMsg::Batch { ts, events, send });
    }

    /// Reset the publisher; `ack` fires once it has.
    pub(crate) fn restart(&self, ack: oneshot::Sender<()>) {
        if let Err(mpsc::error::SendError(PubMsg::Restart(ack))) =
            self.tx.send(PubMsg::Restart(ack))
        {
            let _ = ack.send(());
        }
    }
}
