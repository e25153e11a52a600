//! KV events over real ZeroMQ sockets, decoded as a gateway would: token ids and
//! parent chains, both encodings and every hash form, prefix reuse, eviction,
//! gaps filled by replay, silence and restart.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "tests: a failed unwrap is a failed test"
)]

mod kv;

use std::sync::Arc;

use bytes::Bytes;
use kv::{Batch, Ev, H, PATIENCE, Sub, decode_payload, post, subscribe};
use kvgate_sim::{EventEncoding, HashForm, KvEventsConfig, SimConfig, SimHandle, spawn};
use kvgate_tokenize::PromptTokenizer;
use serde_json::{Value, json};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n\
                      {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn tokenizer() -> Arc<PromptTokenizer> {
    Arc::new(PromptTokenizer::tiktoken("o200k_base", Some(CHATML.to_owned())).unwrap())
}

fn cfg(encoding: EventEncoding, hashes: HashForm, tok: Option<Arc<PromptTokenizer>>) -> SimConfig {
    SimConfig {
        name: "kv".into(),
        block_size: 16,
        // Small prefill chunks: a prompt's blocks arrive over several batches.
        max_batched_tokens: 48,
        default_max_tokens: 1,
        time_scale: 0.0,
        kv_events: Some(KvEventsConfig {
            encoding,
            hashes,
            ..KvEventsConfig::default()
        }),
        tokenizer: tok,
        ..SimConfig::default()
    }
}

async fn start(cfg: SimConfig) -> SimHandle {
    spawn(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

fn chat(turns: &[&str]) -> Value {
    let roles = ["user", "assistant"];
    let messages: Vec<Value> = (turns.iter().enumerate())
        .map(|(i, t)| json!({"role": roles[i % 2], "content": t}))
        .collect();
    json!({"model": "m", "messages": messages, "max_tokens": 1})
}

fn words(seed: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("word{} ", (i * 7 + seed * 13) % 97))
        .collect()
}

/// Every block's hash, parent and ids, checking each run chains to the one before.
fn chain(events: &[Ev], block_size: usize, mut parent: Option<H>) -> (Vec<H>, Vec<u32>) {
    let (mut hashes, mut ids) = (Vec::new(), Vec::new());
    for ev in events {
        let Ev::Stored {
            hashes: h,
            parent: p,
            token_ids,
            block_size: bs,
            ..
        } = ev
        else {
            panic!("not a BlockStored: {ev:?}");
        };
        assert_eq!(*bs, block_size as u64);
        assert_eq!(*p, parent, "a run's parent is the block before it");
        assert_eq!(
            token_ids.len(),
            h.len() * block_size,
            "block_size ids a block"
        );
        parent = h.last().cloned();
        hashes.extend(h.iter().cloned());
        ids.extend_from_slice(token_ids);
    }
    (hashes, ids)
}

#[tokio::test]
async fn stored_blocks_carry_the_tokenizers_ids_in_every_encoding_and_hash_form() {
    let tok = tokenizer();
    for encoding in [EventEncoding::Array, EventEncoding::Map] {
        for form in [HashForm::Int, HashForm::SignedInt, HashForm::Bytes] {
            let sim = start(cfg(encoding, form, Some(tok.clone()))).await;
            let mut sub = subscribe(&sim, form).await;
            let first = chat(&[&words(1, 60)]);
            let ids1 = tok.chat(&first, usize::MAX).unwrap().ids;
            let usage = post(&sim, "/v1/chat/completions", first).await;
            assert_eq!(usage["usage"]["prompt_tokens"], ids1.len(), "{encoding:?}");
            let full1 = ids1.len() / 16;
            assert!(full1 >= 4, "a prompt of several blocks");
            let events = sub.stored(full1).await;
            assert!(
                events.len() > 1,
                "chunked prefill stores over several steps"
            );
            let (hashes1, got) = chain(&events, 16, None);
            assert_eq!(got, ids1[..full1 * 16], "{encoding:?} {form:?}");

            // The next turn shares the first prompt's blocks: only new ones are stored.
            let second = chat(&[&words(1, 60), "ok", &words(2, 40)]);
            let ids2 = tok.chat(&second, usize::MAX).unwrap().ids;
            let shared = ids1.iter().zip(&ids2).take_while(|(a, b)| a == b).count() / 16;
            assert!(shared >= 3 && shared <= full1);
            let reply = post(&sim, "/v1/chat/completions", second).await;
            let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
            assert_eq!(cached, Some(shared as u64 * 16));
            let events = sub.stored(ids2.len() / 16 - shared).await;
            let (_, got) = chain(&events, 16, Some(hashes1[shared - 1].clone()));
            assert_eq!(got, ids2[shared * 16..ids2.len() / 16 * 16]);
        }
    }
}

#[tokio::test]
async fn a_salted_first_block_carries_its_salt_as_extra_keys() {
    let sim = start(cfg(EventEncoding::Map, HashForm::Int, Some(tokenizer()))).await;
    let mut sub = subscribe(&sim, HashForm::Int).await;
    let mut body = chat(&[&words(3, 30)]);
    body["cache_salt"] = json!("tenant-a");
    post(&sim, "/v1/chat/completions", body).await;
    let events = sub.stored(1).await;
    let Ev::Stored {
        parent,
        extra_keys,
        hashes,
        ..
    } = &events[0]
    else {
        panic!()
    };
    assert_eq!(*parent, None);
    let extra = extra_keys
        .as_ref()
        .expect("extra_keys")
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(extra.len(), hashes.len());
    assert_eq!(extra[0].as_array().unwrap()[0].as_str(), Some("tenant-a"));
    assert!(extra[1..].iter().all(rmpv::Value::is_nil));
}

#[tokio::test]
async fn eviction_in_a_tiny_cache_removes_blocks_stored_before() {
    let sim = start(SimConfig {
        cache_blocks: 12,
        ..cfg(EventEncoding::Array, HashForm::Int, None)
    })
    .await;
    let mut sub = subscribe(&sim, HashForm::Int).await;
    // Without a tokenizer a token is 4 bytes; its id is those bytes read LE.
    let prompt = kvgate_sim::block_text(7, 64);
    post(
        &sim,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 1}),
    )
    .await;
    let (stored, ids) = chain(&sub.stored(4).await, 16, None);
    let expect: Vec<u32> = prompt
        .as_bytes()
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ids, expect);
    let mut removed = Vec::new();
    for seed in 10..14 {
        let other = kvgate_sim::block_text(seed, 64);
        post(
            &sim,
            "/v1/completions",
            json!({"prompt": other, "max_tokens": 1}),
        )
        .await;
    }
    while !stored.iter().all(|h| removed.contains(h)) {
        for ev in sub.next().await.events {
            if let Ev::Removed(h) = ev {
                removed.extend(h);
            }
        }
    }
}

/// Send a replay request from `start` and collect `(seq, payload)` up to the end marker.
async fn replay(sim: &SimHandle, start: u64) -> Vec<(u64, Bytes)> {
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&sim.kv_replay_endpoint().unwrap())
        .await
        .unwrap();
    let request = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
    dealer
        .send(ZmqMessage::try_from(request).unwrap())
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let msg = tokio::time::timeout(PATIENCE, dealer.recv())
            .await
            .unwrap()
            .unwrap();
        // vLLM 0.32's replay: [b"", topic, seq, payload]; the end marker
        // [b"", b"", -1, b""].
        let frames = msg.into_vec();
        assert_eq!(frames.len(), 4, "empty delimiter, topic, seq, payload");
        assert!(frames[0].is_empty());
        let seq: [u8; 8] = frames[2].as_ref().try_into().unwrap();
        if seq == [0xFF; 8] {
            assert!(frames[1].is_empty(), "the end marker has an empty topic");
            assert!(frames[3].is_empty(), "the end marker has an empty payload");
            return out;
        }
        out.push((u64::from_be_bytes(seq), frames[3].clone()));
    }
}

fn ids_of(events: &[Ev]) -> Vec<u32> {
    events
        .iter()
        .flat_map(|e| match e {
            Ev::Stored { token_ids, .. } => token_ids.clone(),
            Ev::Removed(_) => Vec::new(),
        })
        .collect()
}

async fn one_block(sim: &SimHandle, sub: &mut Sub, k: u32) -> Batch {
    post(
        sim,
        "/v1/completions",
        json!({"prompt": kv::probe_ids(k), "max_tokens": 1}),
    )
    .await;
    let batch = sub.next().await;
    assert_eq!(ids_of(&batch.events), kv::probe_ids(k));
    batch
}

#[tokio::test]
async fn dropped_batches_leave_a_gap_that_replay_fills() {
    let sim = start(cfg(EventEncoding::Map, HashForm::Bytes, None)).await;
    let mut sub = subscribe(&sim, HashForm::Bytes).await;
    let s0 = sub.synced_seq;
    sim.drop_kv_batches(2);
    for k in 500..502 {
        post(
            &sim,
            "/v1/completions",
            json!({"prompt": kv::probe_ids(k), "max_tokens": 1}),
        )
        .await;
    }
    let after = one_block(&sim, &mut sub, 502).await;
    assert_eq!(after.seq, s0 + 3, "two seqs went unsent");
    let got = replay(&sim, s0 + 1).await;
    let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, vec![s0 + 1, s0 + 2, s0 + 3]);
    for ((_, payload), k) in got.iter().zip(500..) {
        assert_eq!(
            ids_of(&decode_payload(payload, HashForm::Bytes)),
            kv::probe_ids(k)
        );
    }
    assert!(
        replay(&sim, s0 + 4).await.is_empty(),
        "nothing newer: just the end marker"
    );
}

#[tokio::test]
async fn silence_publishes_nothing_and_restart_resets_seq_and_cache() {
    let sim = start(cfg(EventEncoding::Array, HashForm::SignedInt, None)).await;
    let mut sub = subscribe(&sim, HashForm::SignedInt).await;
    let s0 = sub.synced_seq;
    sim.silence_kv_events(true);
    post(
        &sim,
        "/v1/completions",
        json!({"prompt": kv::probe_ids(600), "max_tokens": 1}),
    )
    .await;
    sim.silence_kv_events(false);
    let next = one_block(&sim, &mut sub, 601).await;
    assert_eq!(next.seq, s0 + 1, "a silenced batch takes no seq");
    assert!(
        replay(&sim, s0 + 1).await.len() == 1,
        "nor a place in the buffer"
    );

    sim.restart_kv_publisher().await;
    assert!(
        replay(&sim, 0).await.is_empty(),
        "the replay buffer is emptied"
    );
    // The same prompt again: the emptied cache stores it anew, as seq 0.
    let again = one_block(&sim, &mut sub, 601).await;
    assert_eq!(again.seq, 0);
    let next = one_block(&sim, &mut sub, 602).await;
    assert_eq!(next.seq, 1);
}
