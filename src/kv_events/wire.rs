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

use xxhash_rust::xxh3::xxh3_64;

use super::msgpack::{Kind, Malformed, Reader};
pub use kvgate_routing::held::{EngineHash, Medium};

/// vLLM reports `"GPU"`, `"CPU"`, or nothing (GPU); other offload media
/// (`"DISK"`, LMCache's `"LocalDisk"`…) count with the CPU tier.
fn medium(v: Option<&[u8]>) -> Medium {
    match v.and_then(|v| str_of(v)) {
        None => Medium::Gpu,
        Some(s) if s.eq_ignore_ascii_case(b"gpu") || s.eq_ignore_ascii_case(b"cuda") => Medium::Gpu,
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

impl From<Malformed> for WireError {
    fn from(_: Malformed) -> Self {
        Self::Msgpack("truncated or reserved byte".to_owned())
    }
}

/// Decode a batch payload in one pass over its bytes (see `msgpack`): an
/// event's fields are located by position or name, token ids and hashes are
/// decoded where they lie, and fields routing does not use are skipped.
pub fn decode(payload: &[u8]) -> Result<Batch, WireError> {
    let mut r = Reader::new(payload);
    let Kind::Array(parts) = r.next()? else {
        return Err(WireError::NotABatch);
    };
    if parts < 2 {
        return Err(WireError::NotABatch);
    }
    let ts = match r.next()? {
        Kind::Float(f) => f,
        _ => return Err(WireError::NotABatch),
    };
    let Kind::Array(n) = r.next()? else {
        return Err(WireError::NotABatch);
    };
    let mut events = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        events.push(event(&mut r)?);
    }
    Ok(Batch { ts, events })
}

/// Field slots, by name; an array event's positions map onto them per tag.
const BLOCK_HASHES: usize = 0;
const PARENT: usize = 1;
const TOKEN_IDS: usize = 2;
const BLOCK_SIZE: usize = 3;
const LORA_ID: usize = 4;
const MEDIUM: usize = 5;
const LORA_NAME: usize = 6;
const EXTRA_KEYS: usize = 7;
const SLOTS: usize = 8;

fn slot(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"block_hashes" => BLOCK_HASHES,
        b"parent_block_hash" => PARENT,
        b"token_ids" => TOKEN_IDS,
        b"block_size" => BLOCK_SIZE,
        b"lora_id" => LORA_ID,
        b"medium" => MEDIUM,
        b"lora_name" => LORA_NAME,
        b"extra_keys" => EXTRA_KEYS,
        _ => return None,
    })
}

/// Array positions after the tag: vLLM's field order for each event.
fn positions(tag: &[u8]) -> &'static [usize] {
    match tag {
        b"BlockStored" => &[
            BLOCK_HASHES,
            PARENT,
            TOKEN_IDS,
            BLOCK_SIZE,
            LORA_ID,
            MEDIUM,
            LORA_NAME,
            EXTRA_KEYS,
        ],
        b"BlockRemoved" => &[BLOCK_HASHES, MEDIUM],
        _ => &[],
    }
}

/// One event's tag and fields (nil counts as absent): token ids and hashes
/// decoded, the others as their bytes.
#[derive(Default)]
struct Fields<'a> {
    tag: &'a [u8],
    slots: [Option<&'a [u8]>; SLOTS],
    /// `Some(None)`: present but not a list of token ids.
    tokens: Option<Option<Vec<u32>>>,
    hashes: Option<Vec<EngineHash>>,
}

/// Read one field's value into its slot.
fn field<'a>(r: &mut Reader<'a>, slot: usize, f: &mut Fields<'a>) -> Result<(), Malformed> {
    if r.peek() == Some(0xc0) {
        return r.skip();
    }
    match slot {
        TOKEN_IDS => f.tokens = Some(token_ids(r)?),
        BLOCK_HASHES => f.hashes = Some(hash_list(r)?),
        s => {
            if let Some(v) = f.slots.get_mut(s) {
                *v = Some(r.value()?);
            } else {
                r.skip()?;
            }
        }
    }
    Ok(())
}

/// A map key's name, consumed (`None` for a key that is not a string).
fn key<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, Malformed> {
    let start = *r;
    match r.next()? {
        Kind::Str(k) => Ok(Some(k)),
        Kind::Array(_) | Kind::Map(_) => {
            *r = start;
            r.skip()?;
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// Read one event, consuming it whole whatever it holds.
fn event(r: &mut Reader<'_>) -> Result<Event, Malformed> {
    let start = *r;
    let mut f = Fields::default();
    match r.next()? {
        Kind::Array(0) => return Ok(Event::Unknown),
        Kind::Array(n) => {
            let Kind::Str(tag) = r.next()? else {
                *r = start;
                r.skip()?;
                return Ok(Event::Unknown);
            };
            f.tag = tag;
            let pos = positions(tag);
            for i in 0..n - 1 {
                match pos.get(i) {
                    Some(&s) => field(r, s, &mut f)?,
                    None => r.skip()?,
                }
            }
        }
        Kind::Map(n) => {
            for _ in 0..n {
                match key(r)? {
                    Some(b"type") => {
                        if let Some(tag) = str_of(r.value()?) {
                            f.tag = tag;
                        }
                    }
                    Some(name) => match slot(name) {
                        Some(s) => field(r, s, &mut f)?,
                        None => r.skip()?,
                    },
                    None => r.skip()?,
                }
            }
        }
        _ => return Ok(Event::Unknown),
    }
    Ok(match f.tag {
        b"BlockStored" => stored(f).unwrap_or(Event::Unknown),
        b"BlockRemoved" => Event::Removed {
            hashes: f.hashes.unwrap_or_default(),
            medium: medium(f.slots[MEDIUM]),
        },
        b"AllBlocksCleared" => Event::Cleared,
        _ => Event::Unknown,
    })
}

fn stored(f: Fields<'_>) -> Option<Event> {
    let token_ids = f.tokens??;
    let block_size = match Reader::new(f.slots[BLOCK_SIZE]?).next() {
        Ok(Kind::Uint(b)) => usize::try_from(b).ok()?,
        _ => return None,
    };
    let lora = f.slots[LORA_ID].is_some() || f.slots[LORA_NAME].is_some();
    let salt = f.slots[EXTRA_KEYS].map(first_block_salt);
    Some(Event::Stored {
        hashes: f.hashes.unwrap_or_default(),
        parent: f.slots[PARENT].and_then(|v| hash(&mut Reader::new(v))),
        token_ids,
        block_size,
        lora,
        medium: medium(f.slots[MEDIUM]),
        salt,
    })
}

/// A list of token ids (each below 2³²), consumed whole; `None` if it is
/// anything else.
fn token_ids(r: &mut Reader<'_>) -> Result<Option<Vec<u32>>, Malformed> {
    let start = *r;
    let Kind::Array(n) = r.next()? else {
        *r = start;
        r.skip()?;
        return Ok(None);
    };
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        if let Some(t) = r.small_uint() {
            out.push(t);
            continue;
        }
        if let Kind::Uint(t) = r.next()?
            && let Ok(t) = u32::try_from(t)
        {
            out.push(t);
            continue;
        }
        // Not a token id: skip the rest of the list.
        *r = start;
        r.skip()?;
        return Ok(None);
    }
    Ok(Some(out))
}

/// A list of engine block hashes, consumed whole; items that are not
/// hashes are left out.
fn hash_list(r: &mut Reader<'_>) -> Result<Vec<EngineHash>, Malformed> {
    let start = *r;
    let Kind::Array(n) = r.next()? else {
        *r = start;
        r.skip()?;
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        let item = *r;
        match hash(r) {
            Some(h) => out.push(h),
            None => {
                *r = item;
                r.skip()?;
            }
        }
    }
    Ok(out)
}

/// A string value's bytes (only valid UTF-8 counts as a string).
fn str_of(v: &[u8]) -> Option<&[u8]> {
    match Reader::new(v).next() {
        Ok(Kind::Str(s)) if std::str::from_utf8(s).is_ok() => Some(s),
        _ => None,
    }
}

/// vLLM's first-block extra keys are `lora_name? + mm keys + cache_salt? +
/// prompt-embeds keys`; the salt is the one plain string among them (LoRA
/// blocks are not counted, multimodal keys are arrays, embeds keys bytes).
fn first_block_salt(extra: &[u8]) -> Option<String> {
    let mut r = Reader::new(extra);
    let Ok(Kind::Array(n)) = r.next() else {
        return None;
    };
    if n == 0 {
        return None;
    }
    let first = r.value().ok()?;
    let mut r = Reader::new(first);
    let Ok(Kind::Array(n)) = r.next() else {
        return None;
    };
    let mut salt = None;
    for _ in 0..n {
        let v = r.value().ok()?;
        if let Some(s) = str_of(v) {
            salt = Some(s);
        }
    }
    salt.and_then(|s| std::str::from_utf8(s).ok())
        .map(str::to_owned)
}

/// An engine block hash, read from `r`: an int (signed ones as their two's
/// complement), or bytes (sha256 block hashing) or a string folded by xxh3.
fn hash(r: &mut Reader<'_>) -> Option<EngineHash> {
    match r.next().ok()? {
        Kind::Uint(u) => Some(u),
        Kind::Int(i) => Some(i as u64),
        Kind::Bin(b) => Some(xxh3_64(b)),
        // Some publishers send hex or decimal strings.
        Kind::Str(s) if std::str::from_utf8(s).is_ok() => Some(xxh3_64(s)),
        _ => None,
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
