//! What replicas write to Redis and read back: each replica's figures (one
//! JSON value in the `peers` hash) and placed prompts (entries of the
//! `routed` stream, the chain as little-endian u64s), and the reading of
//! Redis's replies to them.

use redis::Value;
use serde::{Deserialize, Serialize};

use super::Figures;

/// One replica's figures, as it last wrote them.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Redis's clock (ms) when written; 0 when not yet known.
    pub at: u64,
    pub endpoints: Vec<EndpointFigures>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct EndpointFigures {
    pub name: String,
    /// (instance id, its figures from this replica).
    pub instances: Vec<(String, Figures)>,
    /// (tenant, fair-queue service this replica has given it, ever).
    pub service: Vec<(String, f64)>,
}

/// A placed prompt read from the stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub replica: String,
    pub endpoint: String,
    pub instance: String,
    pub chain: Vec<u64>,
}

pub fn chain_bytes(chain: &[u64]) -> Vec<u8> {
    chain.iter().flat_map(|h| h.to_le_bytes()).collect()
}

fn chain_of(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    bytes(v).and_then(|b| std::str::from_utf8(b).ok().map(str::to_owned))
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// `TIME`'s reply in milliseconds.
pub fn time_ms(v: &Value) -> Option<u64> {
    let a = items(v);
    let secs: u64 = text(a.first()?)?.parse().ok()?;
    let micros: u64 = text(a.get(1)?)?.parse().ok()?;
    Some(secs * 1000 + micros / 1000)
}

/// `HGETALL`'s reply (RESP2 pairs or a RESP3 map) as (field, value) pairs.
pub fn hash_pairs(v: &Value) -> Vec<(String, Vec<u8>)> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
        _ => items(v).chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
    };
    pairs
        .into_iter()
        .filter_map(|(k, v)| Some((text(k)?, bytes(v)?.to_vec())))
        .collect()
}

/// `XREAD`'s reply for one stream: its entries in order. Malformed entries
/// are skipped (their ids still advance the cursor).
pub fn stream_entries(v: &Value) -> (Vec<Entry>, Option<String>) {
    // RESP2: [[name, [[id, [f, v, …]], …]]]; RESP3: {name: [[id, [f, v, …]], …]}.
    let per_stream: Vec<&Value> = match v {
        Value::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => items(v).iter().filter_map(|s| items(s).get(1)).collect(),
    };
    let mut out = Vec::new();
    let mut last = None;
    for entries in per_stream {
        for e in items(entries) {
            let e = items(e);
            let Some(id) = e.first().and_then(text) else {
                continue;
            };
            last = Some(id.clone());
            let fields = e.get(1).map(items).unwrap_or_default();
            let get = |name: &[u8]| {
                fields
                    .chunks_exact(2)
                    .find(|p| bytes(&p[0]) == Some(name))
                    .and_then(|p| bytes(&p[1]))
            };
            let field = |name: &[u8]| get(name).and_then(|b| std::str::from_utf8(b).ok());
            let (Some(replica), Some(endpoint), Some(instance), Some(chain)) =
                (field(b"r"), field(b"e"), field(b"i"), get(b"c"))
            else {
                continue;
            };
            out.push(Entry {
                id,
                replica: replica.to_owned(),
                endpoint: endpoint.to_owned(),
                instance: instance.to_owned(),
                chain: chain_of(chain),
            });
        }
    }
    (out, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn stream_entries_in_both_protocols() {
        let chain = chain_bytes(&[1, u64::MAX, 42]);
        let entry = Value::Array(vec![
            bulk("5-0"),
            Value::Array(vec![
                bulk("r"),
                bulk("replica-a"),
                bulk("e"),
                bulk("ep"),
                bulk("i"),
                bulk("sim-1"),
                bulk("c"),
                Value::BulkString(chain),
            ]),
        ]);
        let broken = Value::Array(vec![bulk("6-0"), Value::Array(vec![bulk("r")])]);
        let list = Value::Array(vec![entry, broken]);
        let resp2 = Value::Array(vec![Value::Array(vec![bulk("routed"), list.clone()])]);
        let resp3 = Value::Map(vec![(bulk("routed"), list)]);
        for v in [resp2, resp3] {
            let (entries, last) = stream_entries(&v);
            assert_eq!(
                last.as_deref(),
                Some("6-0"),
                "a bad entry still moves the cursor"
            );
            assert_eq!(entries.len(), 1);
            assert_eq!(entries[0].chain, vec![1, u64::MAX, 42]);
            assert_eq!(
                (&*entries[0].replica, &*entries[0].instance),
                ("replica-a", "sim-1")
            );
        }
        assert_eq!(stream_entries(&Value::Nil), (vec![], None));
    }

    #[test]
    fn time_and_hash_replies() {
        let t = Value::Array(vec![bulk("1700000000"), bulk("123456")]);
        assert_eq!(time_ms(&t), Some(1_700_000_000_123));
        assert_eq!(time_ms(&Value::Nil), None);
        let h = Value::Array(vec![bulk("a"), bulk("{}"), bulk("b")]);
        assert_eq!(hash_pairs(&h), vec![("a".to_owned(), b"{}".to_vec())]);
    }
}
