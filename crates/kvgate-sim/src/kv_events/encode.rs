//! vLLM's KV-event payload in msgpack: `[ts, [event, …]]`, each event either a
//! tagged array (vLLM ≤ 0.10, msgspec `array_like`) or a map with a `"type"` field
//! (current vLLM), block hashes as unsigned, signed or 32-byte values.

use std::io;

use rmp::encode::{
    write_array_len, write_bin, write_f64, write_map_len, write_nil, write_sint, write_str,
    write_uint,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{EventEncoding, HashForm, KvEvent};

/// Everything about the wire format that is fixed for an instance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wire {
    pub encoding: EventEncoding,
    pub hashes: HashForm,
    pub block_size: usize,
}

/// The payload frame of one batch.
pub(crate) fn batch(wire: &Wire, ts: f64, events: &[KvEvent]) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    write_array_len(&mut out, 2)?;
    write_f64(&mut out, ts)?;
    write_array_len(&mut out, len(events.len())?)?;
    for event in events {
        match wire.encoding {
            EventEncoding::Array => array_event(&mut out, wire, event)?,
            EventEncoding::Map => map_event(&mut out, wire, event)?,
        }
    }
    Ok(out)
}

fn array_event(out: &mut Vec<u8>, wire: &Wire, event: &KvEvent) -> io::Result<()> {
    match event {
        KvEvent::Stored {
            hashes,
            parent,
            token_ids,
            ..
        } => {
            write_array_len(out, 7)?;
            write_str(out, "BlockStored")?;
            hash_list(out, wire.hashes, hashes)?;
            opt_hash(out, wire.hashes, *parent)?;
            ids(out, token_ids)?;
            write_uint(out, wire.block_size as u64)?;
            write_nil(out)?; // lora_id
            write_str(out, "GPU")?;
        }
        KvEvent::Removed { hashes } => {
            write_array_len(out, 3)?;
            write_str(out, "BlockRemoved")?;
            hash_list(out, wire.hashes, hashes)?;
            write_str(out, "GPU")?;
        }
    }
    Ok(())
}

fn map_event(out: &mut Vec<u8>, wire: &Wire, event: &KvEvent) -> io::Result<()> {
    match event {
        KvEvent::Stored {
            hashes,
            parent,
            token_ids,
            salt,
        } => {
            write_map_len(out, if salt.is_some() { 9 } else { 8 })?;
            write_str(out, "type")?;
            write_str(out, "BlockStored")?;
            write_str(out, "block_hashes")?;
            hash_list(out, wire.hashes, hashes)?;
            write_str(out, "parent_block_hash")?;
            opt_hash(out, wire.hashes, *parent)?;
            write_str(out, "token_ids")?;
            ids(out, token_ids)?;
            write_str(out, "block_size")?;
            write_uint(out, wire.block_size as u64)?;
            write_str(out, "lora_id")?;
            write_nil(out)?;
            write_str(out, "medium")?;
            write_str(out, "GPU")?;
            write_str(out, "lora_name")?;
            write_nil(out)?;
            if let Some(salt) = salt {
                // One entry a block: the salt is an extra key of the first only.
                write_str(out, "extra_keys")?;
                write_array_len(out, len(hashes.len())?)?;
                for i in 0..hashes.len() {
                    if i == 0 {
                        write_array_len(out, 1)?;
                        write_str(out, salt)?;
                    } else {
                        write_nil(out)?;
                    }
                }
            }
        }
        KvEvent::Removed { hashes } => {
            write_map_len(out, 3)?;
            write_str(out, "type")?;
            write_str(out, "BlockRemoved")?;
            write_str(out, "block_hashes")?;
            hash_list(out, wire.hashes, hashes)?;
            write_str(out, "medium")?;
            write_str(out, "GPU")?;
        }
    }
    Ok(())
}

fn len(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| io::Error::other("msgpack array longer than u32::MAX"))
}

fn ids(out: &mut Vec<u8>, ids: &[u32]) -> io::Result<()> {
    write_array_len(out, len(ids.len())?)?;
    for &id in ids {
        write_uint(out, u64::from(id))?;
    }
    Ok(())
}

fn hash_list(out: &mut Vec<u8>, form: HashForm, hashes: &[u64]) -> io::Result<()> {
    write_array_len(out, len(hashes.len())?)?;
    hashes.iter().try_for_each(|&h| hash(out, form, h))
}

fn opt_hash(out: &mut Vec<u8>, form: HashForm, h: Option<u64>) -> io::Result<()> {
    match h {
        Some(h) => hash(out, form, h),
        None => Ok(write_nil(out)?),
    }
}

fn hash(out: &mut Vec<u8>, form: HashForm, h: u64) -> io::Result<()> {
    match form {
        HashForm::Int => {
            write_uint(out, h)?;
        }
        HashForm::SignedInt => {
            write_sint(out, i64::from_ne_bytes(h.to_ne_bytes()))?;
        }
        HashForm::Bytes => write_bin(out, &hash_bytes(h))?,
    }
    Ok(())
}

/// A 64-bit block hash widened to the 32 bytes of a sha256 digest: the hash itself
/// (big-endian), then three hashes of it, so distinct blocks stay distinct.
pub(crate) fn hash_bytes(h: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        let word = if i == 0 {
            h
        } else {
            xxh3_64_with_seed(&h.to_le_bytes(), i as u64)
        };
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
