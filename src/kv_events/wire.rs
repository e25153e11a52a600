//! vLLM's KV-event wire format, decoded: a ZeroMQ message is
//! `[topic, seq (8 bytes, big-endian), payload]`, the payload a msgpack
//! `[ts, events, data_parallel_rank?]`.
//!
//! vLLM has shipped two encodings of the events, and both are read here:
//! msgspec tagged arrays (`["BlockStored", block_hashes, parent, token_ids,
//! block_size, lora_id, medium, lora_name?, extra_keys?, …]`, vLLM ≤ 0.10) and
//! maps with a `type` member (`{"type": "BlockStored", "block_hashes": …}`,
//! current vLLM, where `omit_defaults` leaves out members at their default).
//! Block hashes have been Python ints (signed or unsigned 64-bit) and, since
//! sha256 block hashing, bytes; each is folded into a `u64` ([`EngineHash`]),
//! used only to link a block to its parent and to its removal. kvgate never
//! relies on the engine's hash function or seed: it hashes the `token_ids` itself.
//!
//! Unknown event types and members are skipped, so a newer vLLM that adds
//! fields does not break routing; a payload that is not a batch at all is an error.

use rmpv::Value;
use xxhash_rust::xxh3::xxh3_64;

pub use kvgate_routing::held::{EngineHash, Medium};

/// vLLM reports `"GPU"`, `"CPU"`, or nothing (GPU); other offload media
/// (`"DISK"`, LMCache's `"LocalDisk"`…) count with the CPU tier.
fn medium(v: Option<&Value>) -> Medium {
    match v.and_then(Value::as_str) {
        None => Medium::Gpu,
        Some(s) if s.eq_ignore_ascii_case("gpu") || s.eq_ignore_ascii_case("cuda") => Medium::Gpu,
        Some(_) => Medium::Cpu,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Stored {
        hashes: Vec<EngineHash>,
        parent: Option<EngineHash>,
        token_ids: Vec<u32>,
        block_size: usize,
        /// The block was computed under a LoRA adapter (id or name).
        lora: bool,
        medium: Medium,
        /// The first block's `cache_salt`, when the event reports `extra_keys`:
        /// `Some(None)` means reported and unsalted, `None` not reported.
        salt: Option<Option<String>>,
    },
    Removed {
        hashes: Vec<EngineHash>,
        medium: Medium,
    },
    Cleared,
    /// An event type this version does not know; skipped.
    Unknown,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<Event>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("payload is not an event batch [ts, events, …]")]
    NotABatch,
    #[error("sequence frame is {0} bytes, not 8")]
    BadSeq(usize),
    #[error("message has {0} frames, not 3 (topic, seq, payload)")]
    Frames(usize),
}

/// The sequence number of a message's second frame.
pub fn seq(frame: &[u8]) -> Result<u64, WireError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| WireError::BadSeq(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// vLLM's end-of-replay marker: sequence −1.
pub const END_OF_REPLAY: u64 = u64::MAX;

pub fn decode(payload: &[u8]) -> Result<Batch, WireError> {
    let mut rd = payload;
    let value = rmpv::decode::read_value(&mut rd).map_err(|e| WireError::Msgpack(e.to_string()))?;
    let Value::Array(parts) = value else {
        return Err(WireError::NotABatch);
    };
    let ts = parts
        .first()
        .and_then(Value::as_f64)
        .ok_or(WireError::NotABatch)?;
    let Some(Value::Array(events)) = parts.get(1) else {
        return Err(WireError::NotABatch);
    };
    Ok(Batch {
        ts,
        events: events.iter().map(event).collect(),
    })
}

/// One event's fields, by name, whichever encoding carried them.
struct Fields<'a> {
    tag: &'a str,
    array: Option<&'a [Value]>,
    map: Option<&'a [(Value, Value)]>,
}

impl<'a> Fields<'a> {
    /// The member `name`, or in the array encoding the element at `index`
    /// (after the tag). Nil counts as absent.
    fn get(&self, name: &str, index: usize) -> Option<&'a Value> {
        let v = if let Some(a) = self.array {
            a.get(index + 1)
        } else {
            self.map?
                .iter()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v)
        };
        v.filter(|v| !v.is_nil())
    }
}

fn fields(v: &Value) -> Option<Fields<'_>> {
    match v {
        Value::Array(a) => Some(Fields {
            tag: a.first()?.as_str()?,
            array: Some(a),
            map: None,
        }),
        Value::Map(m) => {
            let tag = m
                .iter()
                .find(|(k, _)| k.as_str() == Some("type"))
                .and_then(|(_, v)| v.as_str())?;
            Some(Fields {
                tag,
                array: None,
                map: Some(m),
            })
        }
        _ => None,
    }
}

fn event(v: &Value) -> Event {
    let Some(f) = fields(v) else {
        return Event::Unknown;
    };
    match f.tag {
        "BlockStored" => stored(&f).unwrap_or(Event::Unknown),
        "BlockRemoved" => Event::Removed {
            hashes: hashes(f.get("block_hashes", 0)),
            medium: medium(f.get("medium", 1)),
        },
        "AllBlocksCleared" => Event::Cleared,
        _ => Event::Unknown,
    }
}

fn stored(f: &Fields<'_>) -> Option<Event> {
    let token_ids = f
        .get("token_ids", 2)?
        .as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<Vec<u32>>>()?;
    let block_size = usize::try_from(f.get("block_size", 3)?.as_u64()?).ok()?;
    let lora = f.get("lora_id", 4).is_some() || f.get("lora_name", 6).is_some();
    let salt = f.get("extra_keys", 7).map(first_block_salt);
    Some(Event::Stored {
        hashes: hashes(f.get("block_hashes", 0)),
        parent: f.get("parent_block_hash", 1).and_then(hash),
        token_ids,
        block_size,
        lora,
        medium: medium(f.get("medium", 5)),
        salt,
    })
}

/// vLLM's first-block extra keys are `lora_name? + mm keys + cache_salt? +
/// prompt-embeds keys`; the salt is the one plain string among them (LoRA
/// blocks are not counted, multimodal keys are arrays, embeds keys bytes).
fn first_block_salt(extra: &Value) -> Option<String> {
    let first = extra.as_array()?.first()?.as_array()?;
    first
        .iter()
        .filter_map(Value::as_str)
        .next_back()
        .map(str::to_owned)
}

fn hashes(v: Option<&Value>) -> Vec<EngineHash> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(hash).collect())
        .unwrap_or_default()
}

fn hash(v: &Value) -> Option<EngineHash> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|s| s as u64)),
        Value::Binary(b) => Some(xxh3_64(b)),
        // Some publishers send hex or decimal strings.
        Value::String(s) => s.as_str().map(|s| xxh3_64(s.as_bytes())),
        _ => None,
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
