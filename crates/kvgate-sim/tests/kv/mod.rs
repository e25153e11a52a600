//! Helpers for the KV-event tests: a SUB socket synchronised with a running
//! instance, and decoding of either encoding and any hash form into one shape.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::time::Duration;

use kvgate_sim::{HashForm, SimHandle};
use rmpv::Value;
use serde_json::json;
use zeromq::{Socket, SocketRecv, SubSocket, ZmqMessage};

/// Generous: only a broken publisher waits this long.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A block hash as it came off the wire, for equality across events.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum H {
    U(u64),
    I(i64),
    B(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Ev {
    Stored {
        hashes: Vec<H>,
        parent: Option<H>,
        token_ids: Vec<u32>,
        block_size: u64,
        extra_keys: Option<Value>,
    },
    Removed(Vec<H>),
}

#[derive(Debug)]
pub struct Batch {
    pub seq: u64,
    pub events: Vec<Ev>,
}

fn hash(v: &Value, form: HashForm) -> H {
    match (form, v) {
        (HashForm::Int, Value::Integer(i)) => H::U(i.as_u64().expect("unsigned hash")),
        (HashForm::SignedInt, Value::Integer(i)) => H::I(i.as_i64().expect("i64 hash")),
        (HashForm::Bytes, Value::Binary(b)) if b.len() == 32 => H::B(b.clone()),
        _ => panic!("hash {v} is not {form:?}"),
    }
}

fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// Decode a payload `[ts, events]` in either encoding.
pub fn decode_payload(payload: &[u8], form: HashForm) -> Vec<Ev> {
    let v = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    let top = v.as_array().unwrap();
    assert!(
        top[0].as_f64().unwrap() > 1.6e9,
        "ts in seconds since the epoch"
    );
    let hashes = |v: &Value| {
        v.as_array()
            .unwrap()
            .iter()
            .map(|h| hash(h, form))
            .collect()
    };
    let parent = |v: &Value| (!v.is_nil()).then(|| hash(v, form));
    let ids = |v: &Value| {
        let ids = v.as_array().unwrap().iter();
        ids.map(|i| u32::try_from(i.as_u64().unwrap()).unwrap())
            .collect()
    };
    let mut out = Vec::new();
    for e in top[1].as_array().unwrap() {
        if let Some(a) = e.as_array() {
            match a[0].as_str().unwrap() {
                "BlockStored" => {
                    assert_eq!(a.len(), 7);
                    assert!(a[5].is_nil() && a[6].as_str() == Some("GPU"));
                    out.push(Ev::Stored {
                        hashes: hashes(&a[1]),
                        parent: parent(&a[2]),
                        token_ids: ids(&a[3]),
                        block_size: a[4].as_u64().unwrap(),
                        extra_keys: None,
                    });
                }
                "BlockRemoved" => {
                    assert_eq!(a[2].as_str(), Some("GPU"));
                    out.push(Ev::Removed(hashes(&a[1])));
                }
                other => panic!("unexpected event {other}"),
            }
            continue;
        }
        let get = |k| field(e, k).unwrap_or_else(|| panic!("no {k} in {e}"));
        match get("type").as_str().unwrap() {
            "BlockStored" => {
                assert!(get("lora_id").is_nil() && get("lora_name").is_nil());
                assert_eq!(get("medium").as_str(), Some("GPU"));
                out.push(Ev::Stored {
                    hashes: hashes(get("block_hashes")),
                    parent: parent(get("parent_block_hash")),
                    token_ids: ids(get("token_ids")),
                    block_size: get("block_size").as_u64().unwrap(),
                    extra_keys: field(e, "extra_keys").cloned(),
                });
            }
            "BlockRemoved" => out.push(Ev::Removed(hashes(get("block_hashes")))),
            other => panic!("unexpected event {other}"),
        }
    }
    out
}

/// A PUB message `[topic, seq, payload]`.
pub fn decode_msg(msg: ZmqMessage, form: HashForm) -> Batch {
    let frames = msg.into_vec();
    assert_eq!(frames.len(), 3, "topic, seq, payload");
    assert!(frames[0].is_empty(), "vLLM's default topic");
    let seq = u64::from_be_bytes(frames[1].as_ref().try_into().unwrap());
    Batch {
        seq,
        events: decode_payload(&frames[2], form),
    }
}

pub struct Sub {
    pub sub: SubSocket,
    pub form: HashForm,
    /// Seq of the probe batch that proved the subscription live.
    pub synced_seq: u64,
}

impl Sub {
    /// The next batch; fails the test after [`PATIENCE`].
    pub async fn next(&mut self) -> Batch {
        let msg = tokio::time::timeout(PATIENCE, self.sub.recv()).await;
        decode_msg(msg.expect("no KV batch in time").unwrap(), self.form)
    }

    /// Stored events of the next batches until `blocks` blocks have been stored.
    pub async fn stored(&mut self, blocks: usize) -> Vec<Ev> {
        let mut out = Vec::new();
        let mut n = 0;
        while n < blocks {
            for ev in self.next().await.events {
                if let Ev::Stored { hashes, .. } = &ev {
                    n += hashes.len();
                    out.push(ev);
                }
            }
        }
        out
    }
}

/// A one-block completion of ids nothing else uses.
pub fn probe_ids(k: u32) -> Vec<u32> {
    (0..16).map(|i| 100_000 + k * 16 + i).collect()
}

pub async fn post(sim: &SimHandle, path: &str, body: serde_json::Value) -> serde_json::Value {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", sim.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap()
}

/// Subscribe and wait out the slow-joiner effect: send probes until one's
/// `BlockStored` arrives; everything received later follows that batch.
pub async fn subscribe(sim: &SimHandle, form: HashForm) -> Sub {
    let mut sub = SubSocket::new();
    sub.connect(&sim.kv_events_endpoint().unwrap())
        .await
        .unwrap();
    sub.subscribe("").await.unwrap();
    for k in 0..200 {
        let ids = probe_ids(k);
        post(
            sim,
            "/v1/completions",
            json!({"prompt": ids, "max_tokens": 1}),
        )
        .await;
        while let Ok(Ok(msg)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
            let batch = decode_msg(msg, form);
            let mine = batch
                .events
                .iter()
                .any(|e| matches!(e, Ev::Stored { token_ids, .. } if *token_ids == ids));
            if mine {
                return Sub {
                    sub,
                    form,
                    synced_seq: batch.seq,
                };
            }
        }
    }
    panic!("the subscription never went live");
}
