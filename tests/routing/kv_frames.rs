//! A stand-in for vLLM's `ZmqEventPublisher`, for tests: a real ZeroMQ PUB
//! socket and ROUTER replay socket, frames `[topic, seq (8 BE), payload]`
//! and payloads built value by value the way msgspec writes them, in both
//! encodings vLLM has shipped. Independent of kvgate's decoder and of the
//! simulator's encoder.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmpv::Value;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// vLLM ≤ 0.10: msgspec `array_like` tagged arrays.
    Array,
    /// Current vLLM: maps with a `type` member.
    Map,
}

type Buffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// How the replay socket answers: as vLLM's ROUTER does when its send
/// high-water mark is reached, the messages of an answer numbered
/// `lost.0..lost.0 + lost.1` (the end marker included) are dropped; each
/// message after `pace_after` waits `pace`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Answer {
    pub lost: Option<(usize, usize)>,
    pub pace_after: usize,
    pub pace: Duration,
}

pub struct Publisher {
    pub_sock: zeromq::PubSocket,
    pub events_url: String,
    pub replay_url: String,
    buffer: Buffer,
    next: u64,
    pub encoding: Encoding,
    pub answer: Arc<Mutex<Answer>>,
    router: tokio::task::JoinHandle<()>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.router.abort();
    }
}

fn s(v: &str) -> Value {
    Value::from(v)
}

fn hashes(h: &[u64]) -> Value {
    Value::Array(h.iter().map(|&x| Value::from(x)).collect())
}

impl Publisher {
    pub async fn start(encoding: Encoding) -> Self {
        Self::start_at(encoding, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0").await
    }

    /// Bound at the given addresses (a restarted engine comes back at its old
    /// ones: pass the `events_url` and `replay_url` of the one it replaces).
    pub async fn start_at(encoding: Encoding, events: &str, replay: &str) -> Self {
        let mut pub_sock = zeromq::PubSocket::new();
        let events_url = pub_sock.bind(events).await.unwrap().to_string();
        let mut router = zeromq::RouterSocket::new();
        let replay_url = router.bind(replay).await.unwrap().to_string();
        let buffer: Buffer = Arc::default();
        let buf = Arc::clone(&buffer);
        let answer: Arc<Mutex<Answer>> = Arc::default();
        let how = Arc::clone(&answer);
        let task = tokio::spawn(async move {
            while let Ok(req) = router.recv().await {
                let frames: Vec<Vec<u8>> = req.iter().map(|b| b.to_vec()).collect();
                let [id, _, start] = frames.as_slice() else {
                    continue;
                };
                let start = u64::from_be_bytes(start.as_slice().try_into().unwrap());
                let held: Vec<(u64, Vec<u8>)> = buf.lock().unwrap().clone();
                let how = *how.lock().unwrap();
                let lost = |i: usize| how.lost.is_some_and(|(from, n)| i >= from && i - from < n);
                let mut i = 0;
                for (seq, payload) in held.into_iter().filter(|(q, _)| *q >= start) {
                    i += 1;
                    if lost(i - 1) {
                        continue;
                    }
                    if i > how.pace_after && !how.pace.is_zero() {
                        tokio::time::sleep(how.pace).await;
                    }
                    let mut m = ZmqMessage::from(id.clone());
                    m.push_back(Vec::<u8>::new().into());
                    m.push_back(seq.to_be_bytes().to_vec().into());
                    m.push_back(payload.into());
                    // A reader that went away: the rest would be dropped.
                    if router.send(m).await.is_err() {
                        break;
                    }
                }
                if lost(i) {
                    continue;
                }
                let mut end = ZmqMessage::from(id.clone());
                end.push_back(Vec::<u8>::new().into());
                end.push_back(u64::MAX.to_be_bytes().to_vec().into());
                end.push_back(Vec::<u8>::new().into());
                let _ = router.send(end).await;
            }
        });
        Self {
            pub_sock,
            events_url,
            replay_url,
            buffer,
            next: 0,
            encoding,
            answer,
            router: task,
        }
    }

    fn payload(events: Vec<Value>) -> Vec<u8> {
        let batch = Value::Array(vec![Value::F64(1.7e9), Value::Array(events)]);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &batch).unwrap();
        out
    }

    /// Publish a batch (buffered for replay too); `publish: false` makes a gap.
    pub async fn batch(&mut self, events: Vec<Value>, publish: bool) -> u64 {
        let seq = self.next;
        self.next += 1;
        let payload = Self::payload(events);
        self.buffer.lock().unwrap().push((seq, payload.clone()));
        if publish {
            let mut m = ZmqMessage::from(Vec::<u8>::new());
            m.push_back(seq.to_be_bytes().to_vec().into());
            m.push_back(payload.into());
            self.pub_sock.send(m).await.unwrap();
        }
        seq
    }

    /// Publish batch `seq`, already buffered (so that later ones can be
    /// buffered before it goes out).
    pub async fn publish_buffered(&mut self, seq: u64) {
        let payload = self
            .buffer
            .lock()
            .unwrap()
            .iter()
            .find(|(q, _)| *q == seq)
            .map(|(_, p)| p.clone())
            .unwrap();
        let mut m = ZmqMessage::from(Vec::<u8>::new());
        m.push_back(seq.to_be_bytes().to_vec().into());
        m.push_back(payload.into());
        self.pub_sock.send(m).await.unwrap();
    }

    pub async fn send(&mut self, events: Vec<Value>) -> u64 {
        self.batch(events, true).await
    }

    /// The replay buffer drops batches before `seq` (a bounded buffer that
    /// has moved on).
    pub fn forget_before(&self, seq: u64) {
        self.buffer.lock().unwrap().retain(|(q, _)| *q >= seq);
    }

    /// As a restarted vLLM looks: numbering from 0, nothing buffered.
    pub fn restart(&mut self) {
        self.next = 0;
        self.buffer.lock().unwrap().clear();
    }

    /// BlockStored for `blocks` blocks of `tokens` (engine hashes `first..`),
    /// parented on `parent`; `salt` goes in extra_keys (map encoding only).
    pub fn stored(
        &self,
        first: u64,
        parent: Option<u64>,
        tokens: &[u32],
        block_size: usize,
        salt: Option<&str>,
    ) -> Value {
        let n = tokens.len() / block_size;
        let hs: Vec<u64> = (first..first + n as u64).collect();
        let ids = Value::Array(
            tokens[..n * block_size]
                .iter()
                .map(|&t| Value::from(t))
                .collect(),
        );
        let parent = parent.map_or(Value::Nil, Value::from);
        match self.encoding {
            Encoding::Array => Value::Array(vec![
                s("BlockStored"),
                hashes(&hs),
                parent,
                ids,
                Value::from(block_size as u64),
                Value::Nil,
                s("GPU"),
            ]),
            Encoding::Map => {
                let mut m = vec![
                    (s("type"), s("BlockStored")),
                    (s("block_hashes"), hashes(&hs)),
                    (s("parent_block_hash"), parent),
                    (s("token_ids"), ids),
                    (s("block_size"), Value::from(block_size as u64)),
                    (s("lora_id"), Value::Nil),
                    (s("medium"), s("GPU")),
                    (s("lora_name"), Value::Nil),
                ];
                if let Some(salt) = salt {
                    let mut extra = vec![Value::Array(vec![s(salt)])];
                    extra.extend((1..n).map(|_| Value::Nil));
                    m.push((s("extra_keys"), Value::Array(extra)));
                }
                Value::Map(m)
            }
        }
    }

    pub fn removed(&self, hs: &[u64]) -> Value {
        match self.encoding {
            Encoding::Array => Value::Array(vec![s("BlockRemoved"), hashes(hs), s("GPU")]),
            Encoding::Map => Value::Map(vec![
                (s("type"), s("BlockRemoved")),
                (s("block_hashes"), hashes(hs)),
                (s("medium"), s("GPU")),
            ]),
        }
    }
}
