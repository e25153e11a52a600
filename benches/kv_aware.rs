//! Criterion benchmark of the whole `kv_aware` decision for a 16 KiB chat
//! body on 7 instances: parse, window and key, the chat template and
//! tokenizer (SmolLM2's, from fixtures/), the token-block keys, a lookup in
//! every instance's event-fed index, and the plan. The indexes are filled by
//! real KV events over ZeroMQ (a PUB socket in this process), and the
//! instances are subscribed and live, as in production.
//!
//! Two cases: the same body again (every segment's tokens cached) and a body
//! whose last user turn is new each time (the system prompt and history
//! cached, the new turn tokenized): the realistic one for conversations.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "benchmark setup")]

use std::hint::black_box;
use std::time::Duration;

use axum::http::HeaderMap;
use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kvgate_prefix::Api;
use rmpv::Value;
use zeromq::{Socket, SocketSend, ZmqMessage};

mod common;

const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/smollm2/tokenizer.json"
);

fn body(bytes: usize, last: &str) -> serde_json::Value {
    let mut messages = common::conversation(bytes);
    messages.push(serde_json::json!({"role": "user", "content": last}));
    serde_json::json!({"model": "m", "stream": true, "messages": messages})
}

fn stored(hashes: std::ops::Range<u64>, ids: &[u32]) -> Value {
    let s = Value::from;
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (
            s("block_hashes"),
            Value::Array(hashes.map(Value::from).collect()),
        ),
        (s("parent_block_hash"), Value::Nil),
        (
            s("token_ids"),
            Value::Array(ids.iter().map(|&t| Value::from(t)).collect()),
        ),
        (s("block_size"), Value::from(16)),
        (s("medium"), s("GPU")),
    ])
}

async fn publish(sock: &mut zeromq::PubSocket, seq: u64, events: Vec<Value>) {
    let batch = Value::Array(vec![Value::F64(0.0), Value::Array(events)]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).unwrap();
    let mut m = ZmqMessage::from(Vec::<u8>::new());
    m.push_back(seq.to_be_bytes().to_vec().into());
    m.push_back(payload.into());
    sock.send(m).await.unwrap();
}

fn kv_aware_decision(c: &mut Criterion) {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let _enter = tokio.enter();
    let mut sock = zeromq::PubSocket::new();
    let url = tokio
        .block_on(sock.bind("tcp://127.0.0.1:0"))
        .unwrap()
        .to_string();
    let instances: String = (0..7)
        .map(|i| format!("      - {{ url: \"http://10.0.0.{i}:8000\", kv_events: \"{url}\" }}\n"))
        .collect();
    let yaml = format!(
        "endpoints:\n  - name: chat\n    models: [\"m\"]\n    instances:\n{instances}    routing: {{ strategy: kv_aware, tokenizer: \"{TOKENIZER}\" }}\n"
    );
    let rt = kvgate::Runtime::build(kvgate::Config::from_yaml(&yaml).unwrap(), None).unwrap();
    let ep = rt.endpoints[0].clone();
    let tok = kvgate_tokenize::PromptTokenizer::load(TOKENIZER, None).unwrap();
    let base = body(16 << 10, "And now?");
    let ids = tok.chat(&base, usize::MAX).unwrap().ids;
    let blocks = ids.len() as u64 / 16;
    // 100,000 other blocks across the fleet (every instance hears every
    // batch: one publisher here), and this conversation's blocks.
    tokio.block_on(async {
        let mut seq = 0;
        loop {
            publish(&mut sock, seq, vec![]).await;
            seq += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let heard = ep.instances.iter().all(|i| {
                i.kv_feed().is_some_and(|s| {
                    s.feed
                        .counters
                        .batches
                        .load(std::sync::atomic::Ordering::Relaxed)
                        > 0
                })
            });
            if heard {
                break;
            }
        }
        for chunk in 0..100u64 {
            let other: Vec<u32> = (0..16_000)
                .map(|t| (t * 7 + chunk as u32) % 49_000)
                .collect();
            publish(
                &mut sock,
                seq,
                vec![stored(
                    chunk * 1000 + 10_000_000..chunk * 1000 + 10_001_000,
                    &other,
                )],
            )
            .await;
            seq += 1;
        }
        publish(
            &mut sock,
            seq,
            vec![stored(0..blocks, &ids[..blocks as usize * 16])],
        )
        .await;
        while ep.instances[0]
            .kv_feed()
            .map_or(0, |s| s.feed.held_blocks())
            < 100_000
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let headers = HeaderMap::new();
    let decide = |bytes: Bytes| {
        let a = kvgate::request::analyse(&rt, Api::Chat, None, &headers, bytes, "tenant").unwrap();
        let ep = &a.input.endpoint;
        let (loads, _) = a.input.view();
        black_box(ep.policy.plan(&a.input.routing_request(), &loads))
    };
    let same = Bytes::from(serde_json::to_vec(&base).unwrap());
    let plan = decide(same.clone());
    assert_eq!(
        plan.reason,
        kvgate_routing::Reason::CacheHit,
        "the fleet is warm"
    );
    let mut g = c.benchmark_group("kv_aware_decision_16KiB");
    g.bench_function("same_body", |b| b.iter(|| decide(same.clone())));
    let mut turn = 0u64;
    g.bench_function("new_last_turn", |b| {
        b.iter_batched(
            || {
                turn += 1;
                let q = format!("Question {turn}: what changed since the last release?");
                Bytes::from(serde_json::to_vec(&body(16 << 10, &q)).unwrap())
            },
            decide,
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, kv_aware_decision);
criterion_main!(benches);
