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
//!
//! Issue 31, at scale: the new-last-turn case on 7 to 1,000 instances, every
//! one subscribed (live) and its event-fed index full at the default capacity
//! (24,000 engine blocks: conversations under shared system prompts), its
//! approximate index full too; and a ~100k-token agent prompt whose earlier
//! turns were seen (their segments tokenized) and whose new turn is not, next
//! to the same body through `longest_prefix` (what kv_aware adds is the
//! difference). The indexes are filled through the feeds' own batch decoder
//! (`Feed::apply_payload`, what the subscriber calls for each message): one
//! publisher cannot send each of 1,000 subscribers its own history.
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

/// The gateway's own allocator (`src/main.rs`), so that a decision's
/// allocations cost here what they cost in the shipped binary.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    stored_under(None, hashes, ids)
}

/// A BlockStored of `hashes` under `parent` (`None`: a prompt's first block).
fn stored_under(parent: Option<u64>, hashes: std::ops::Range<u64>, ids: &[u32]) -> Value {
    let s = Value::from;
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (
            s("block_hashes"),
            Value::Array(hashes.map(Value::from).collect()),
        ),
        (
            s("parent_block_hash"),
            parent.map_or(Value::Nil, Value::from),
        ),
        (
            s("token_ids"),
            Value::Array(ids.iter().map(|&t| Value::from(t)).collect()),
        ),
        (s("block_size"), Value::from(16)),
        (s("medium"), s("GPU")),
    ])
}

/// One batch's payload as vLLM publishes it.
fn payload(events: Vec<Value>) -> Vec<u8> {
    let batch = Value::Array(vec![Value::F64(0.0), Value::Array(events)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).unwrap();
    out
}

async fn publish(sock: &mut zeromq::PubSocket, seq: u64, events: Vec<Value>) {
    let payload = payload(events);
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

/// Engine blocks an instance holds at the default 384,000-token capacity.
const FULL_BLOCKS: u64 = 384_000 / 16;

/// Instances a publisher socket serves, and instances that join the fleet
/// at a time: a thousand subscribers handshaking at once with one socket on
/// this 2-core machine retried past their one-second connect timeout over
/// and over, and a fifth never connected (production has one publisher an
/// engine, and engines join a running gateway a few at a time).
const SUBSCRIBERS_A_SOCKET: usize = 50;
const JOINING: usize = 100;

/// A kv_aware fleet: its runtime (whose instances follow `socks`) and the sockets.
struct Fleet {
    rt: kvgate::Runtime,
    _socks: Vec<zeromq::PubSocket>,
}

/// Endpoints of `n` kv_aware instances each, every instance subscribed to
/// a PUB socket here and live (connected, caught up), indexes empty: built
/// as a reload adds instances, [`JOINING`] at a time, each batch live
/// before the next joins (kept instances keep their subscriptions).
/// `endpoints`: each one's model (and name) and `routing:` keys; those of
/// `kv_aware` get the tokenizer and their instances the sockets.
fn live_fleet(tokio: &tokio::runtime::Runtime, n: usize, endpoints: &[(&str, &str)]) -> Fleet {
    let mut socks = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..n.div_ceil(SUBSCRIBERS_A_SOCKET) {
        let mut sock = zeromq::PubSocket::new();
        let url = tokio.block_on(sock.bind("tcp://127.0.0.1:0")).unwrap();
        urls.push(url.to_string());
        socks.push(sock);
    }
    let yaml = |n: usize| {
        let mut yaml = String::from("endpoints:\n");
        for (model, routing) in endpoints {
            let (instances, routing) = if routing.contains("kv_aware") {
                (
                    common::instances_yaml(n, |i| {
                        format!(", kv_events: \"{}\"", urls[i / SUBSCRIBERS_A_SOCKET])
                    }),
                    format!("{routing}, tokenizer: \"{TOKENIZER}\""),
                )
            } else {
                (
                    common::instances_yaml(n, |_| String::new()),
                    (*routing).to_owned(),
                )
            };
            yaml += &format!(
                "  - name: {model}\n    models: [\"{model}\"]\n    instances:\n{instances}    routing: {{ {routing} }}\n"
            );
        }
        yaml
    };
    let mut rt: Option<kvgate::Runtime> = None;
    let mut m = 0;
    while m < n {
        m = (m + JOINING).min(n);
        let next =
            kvgate::Runtime::build(kvgate::Config::from_yaml(&yaml(m)).unwrap(), rt.as_ref())
                .unwrap();
        wait_live(tokio, &next);
        rt = Some(next);
    }
    Fleet {
        rt: rt.unwrap(),
        _socks: socks,
    }
}

/// Until every subscription of `rt` is live (at most 3 minutes).
fn wait_live(tokio: &tokio::runtime::Runtime, rt: &kvgate::Runtime) {
    let started = std::time::Instant::now();
    tokio.block_on(async {
        loop {
            let now = std::time::Instant::now();
            let (live, all) = rt
                .endpoints
                .iter()
                .flat_map(|e| &e.instances)
                .filter_map(|i| i.kv_feed())
                .fold((0, 0), |(l, a), s| {
                    (l + usize::from(s.feed.trust(now).is_live()), a + 1)
                });
            if live == all {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "{live} of {all} subscriptions live after 3 minutes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Fill instance `i` to [`FULL_BLOCKS`], as its engine's events would: the
/// first 64 blocks of [`common::PROMPTS_AN_INSTANCE`] of the fleet's shared
/// system prompts, then conversations of 96 blocks of its own under them.
fn fill_events(inst: &kvgate::fleet::Instance, i: u64) {
    let Some(sub) = inst.kv_feed() else { return };
    let prompts: Vec<u64> = (0..common::PROMPTS_AN_INSTANCE)
        .map(|k| (i + k * 17) % common::SHARED_PROMPTS)
        .collect();
    let mut events = Vec::new();
    for &p in &prompts {
        let ids: Vec<u32> = (0..64 * 16)
            .map(|t| (p * 1_000 + t) as u32 % 49_000)
            .collect();
        let first = 1 << 40 | p << 8;
        events.push(stored_under(None, first..first + 64, &ids));
    }
    let mut held = 64 * prompts.len() as u64;
    let mut c = 0u64;
    while held < FULL_BLOCKS {
        let under = prompts[(c % prompts.len() as u64) as usize];
        let ids: Vec<u32> = (0..96 * 16u64)
            .map(|t| {
                ((i * 7_919 + c * 104_729 + t).wrapping_mul(2_654_435_761) >> 7) as u32 % 49_000
            })
            .collect();
        let first = 2 << 40 | c << 8;
        events.push(stored_under(
            Some(1 << 40 | under << 8 | 63),
            first..first + 96,
            &ids,
        ));
        held += 96;
        c += 1;
    }
    sub.feed.apply_payload(&payload(events));
    assert!(sub.feed.held_blocks() as u64 >= FULL_BLOCKS);
}

/// Instance `inst` holds the first `blocks` blocks of `ids`.
fn hold(inst: &kvgate::fleet::Instance, ids: &[u32], blocks: usize) {
    let Some(sub) = inst.kv_feed() else { return };
    let events = vec![stored(0..blocks as u64, &ids[..blocks * 16])];
    sub.feed.apply_payload(&payload(events));
}

/// Fill every instance of `ep` (both indexes, see [`fill_events`] and
/// `common::fill_index`), then put `ids`' first half (the system prompt) on
/// every 16th instance and `held` of its blocks on one holder, whose
/// approximate index also holds `chain` (instances without events: the
/// approximate index only).
fn fill_fleet(ep: &kvgate::fleet::Endpoint, ids: &[u32], held: usize, chain: &[u64]) {
    for (i, inst) in ep.instances.iter().enumerate() {
        common::fill_index(&inst.index, i as u64);
        fill_events(inst, i as u64);
    }
    for inst in ep.instances.iter().skip(5).step_by(16) {
        hold(inst, ids, ids.len() / 32);
    }
    let holder = &ep.instances[ep.instances.len() * 3 / 7];
    hold(holder, ids, held);
    holder.index.insert(chain);
}

/// The whole decision, as in [`kv_aware_decision`].
fn decide(rt: &kvgate::Runtime, bytes: Bytes) -> kvgate_routing::Plan {
    let headers = HeaderMap::new();
    let a = kvgate::request::analyse(rt, Api::Chat, None, &headers, bytes, "tenant").unwrap();
    let (loads, _) = a.input.view();
    black_box(
        a.input
            .endpoint
            .policy
            .plan(&a.input.routing_request(), &loads),
    )
}

/// A fleet of `n` live kv_aware instances with full indexes (see
/// [`fill_fleet`]), the holder holding three quarters of `ids` (`base`'s tokens).
fn full_kv_fleet(tokio: &tokio::runtime::Runtime, n: usize, ids: &[u32], base: &Bytes) -> Fleet {
    let started = std::time::Instant::now();
    let f = live_fleet(tokio, n, &[("m", "strategy: kv_aware")]);
    let headers = HeaderMap::new();
    let a =
        kvgate::request::analyse(&f.rt, Api::Chat, None, &headers, base.clone(), "tenant").unwrap();
    fill_fleet(
        &f.rt.endpoints[0],
        ids,
        ids.len() / 16 * 3 / 4,
        &a.input.chain,
    );
    eprintln!("{n} instances live and full in {:?}", started.elapsed());
    f
}

/// Issue 31: the new-last-turn case for a 16 KiB body on 7 to 1,000 live
/// instances with full indexes; the holder has the body's first three
/// quarters. Each fleet is built only when its case runs and dropped after.
/// At 1,000 instances, each step alone too (`_only`: analyse with a new
/// turn, the view, the plan).
fn kv_aware_at_scale(c: &mut Criterion) {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let _enter = tokio.enter();
    let tok = kvgate_tokenize::PromptTokenizer::load(TOKENIZER, None).unwrap();
    let base = body(16 << 10, "And now?");
    let ids = tok.chat(&base, usize::MAX).unwrap().ids;
    let base_bytes = Bytes::from(serde_json::to_vec(&base).unwrap());
    let headers = HeaderMap::new();
    let mut turn = 0u64;
    let mut new_turn = || {
        turn += 1;
        let q = format!("Question {turn}: what changed since the last release?");
        Bytes::from(serde_json::to_vec(&body(16 << 10, &q)).unwrap())
    };
    let mut g = c.benchmark_group("kv_aware_decision_16KiB_full");
    for n in common::FLEETS {
        let mut fleet: Option<Fleet> = None;
        let parts: &[&str] = if n == 1000 {
            &["", "_analyse_only", "_view_only", "_plan_only"]
        } else {
            &[""]
        };
        for part in parts {
            g.bench_function(format!("{n}_instances{part}"), |b| {
                let rt = &fleet
                    .get_or_insert_with(|| full_kv_fleet(&tokio, n, &ids, &base_bytes))
                    .rt;
                assert_eq!(
                    decide(rt, base_bytes.clone()).reason,
                    kvgate_routing::Reason::CacheHit
                );
                let analyse = |bytes| {
                    kvgate::request::analyse(rt, Api::Chat, None, &headers, bytes, "tenant")
                        .unwrap()
                };
                let a = analyse(new_turn());
                let (loads, _) = a.input.view();
                let req = a.input.routing_request();
                match *part {
                    "" => b.iter_batched(
                        &mut new_turn,
                        |bytes| decide(rt, bytes),
                        BatchSize::SmallInput,
                    ),
                    "_analyse_only" => {
                        b.iter_batched(&mut new_turn, analyse, BatchSize::SmallInput)
                    }
                    "_view_only" => b.iter(|| a.input.view()),
                    _ => b.iter(|| a.input.endpoint.policy.plan(black_box(&req), &loads)),
                }
            });
        }
    }
    g.finish();
}

/// An agent's conversation of about `chars` characters: a system prompt of
/// tool descriptions, then steps of a request, the agent's tool call and the
/// tool's output (a test log).
fn agent_conversation(chars: usize) -> Vec<serde_json::Value> {
    let system = (0..60)
        .map(|t| format!("Tool run_{t}(path: string, args: list[string]) -> log: runs step {t} of the build in the given crate and returns its log; fails when the crate does not build.\n"))
        .collect::<String>();
    let mut used = system.len();
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    let mut step = 0;
    while used < chars {
        let ask =
            format!("Step {step}: run the tests of crates/module_{step} and tell me what failed.");
        let call = format!(
            "Calling run_{}(\"crates/module_{step}\", [\"--all-targets\"]).",
            step % 60
        );
        messages.push(serde_json::json!({"role": "user", "content": ask}));
        messages.push(serde_json::json!({"role": "assistant", "content": call}));
        messages.push(serde_json::json!({"role": "user", "content": tool_log(step, 60)}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("All {} tests of module_{step} passed; moving on.", 60)}));
        used += messages[messages.len() - 4..]
            .iter()
            .map(|m| m["content"].as_str().unwrap().len())
            .sum::<usize>();
        step += 1;
    }
    messages
}

/// A tool's output of `lines` lines for step `step`.
fn tool_log(step: u64, lines: u64) -> String {
    (0..lines)
        .map(|j| {
            format!(
                "test module_{step}::case_{j}::checks_{} ... ok ({}.{} ms)\n",
                j * 37 % 11,
                (step * 13 + j * 7) % 97,
                j % 10
            )
        })
        .collect()
}

/// A ~100k-token agent prompt: the earlier turns were seen (the previous
/// request of the conversation tokenized them: their segments are cached)
/// and the holder holds their blocks; the new turn (a tool's output of
/// about 2.5 KiB, its step number new) is new each time. On 7 instances with full indexes.
/// `kv_aware` reaches the whole prompt (`max_prompt_blocks: 2048`, 131,072
/// tokens); `kv_aware_short_question` is the same with a new turn of one
/// short question instead (what the prompt's length costs by itself);
/// `kv_aware_default_reach` stops at the defaults' 65,536 tokens and so never
/// tokenizes the new turn; `longest_prefix` is the same body without
/// tokenizing or event lookups.
fn kv_aware_long_prompt(c: &mut Criterion) {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let _enter = tokio.enter();
    let earlier = agent_conversation(214_000);
    let with = |model: &str, last: &str| {
        let mut messages = earlier.clone();
        messages.push(serde_json::json!({"role": "user", "content": last}));
        let body = serde_json::json!({"model": model, "stream": true, "messages": messages});
        Bytes::from(serde_json::to_vec(&body).unwrap())
    };
    let mut fleet: Option<Fleet> = None;
    let mut g = c.benchmark_group("kv_aware_decision_100k_tokens");
    for (model, name, tool_output) in [
        ("kv", "kv_aware", true),
        ("kv", "kv_aware_short_question", false),
        ("kvdefault", "kv_aware_default_reach", true),
        ("lp", "longest_prefix", true),
    ] {
        let mut turn = 0u64;
        g.bench_function(name, |b| {
            let f = fleet.get_or_insert_with(|| long_prompt_fleet(&tokio, &earlier));
            b.iter_batched(
                || {
                    turn += 1;
                    let last = if tool_output {
                        tool_log(10_000 + turn, 40)
                    } else {
                        format!("Question {turn}: what changed since the last release?")
                    };
                    with(model, &last)
                },
                |bytes| decide(&f.rt, bytes),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

/// Where [`kv_aware_long_prompt`]'s `kv_aware` time goes: each step alone,
/// with a new turn each time where the step tokenizes.
fn kv_aware_long_prompt_parts(c: &mut Criterion) {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let _enter = tokio.enter();
    let earlier = agent_conversation(214_000);
    let with = |last: &str| {
        let mut messages = earlier.clone();
        messages.push(serde_json::json!({"role": "user", "content": last}));
        serde_json::json!({"model": "kv", "stream": true, "messages": messages})
    };
    let mut fleet: Option<Fleet> = None;
    let mut g = c.benchmark_group("kv_aware_parts_100k_tokens");
    for part in [
        "analyse",
        "render",
        "tokenize",
        "encode_cached",
        "encode_new_turn",
        "view",
        "plan",
    ] {
        let mut turn = 0u64;
        g.bench_function(part, |b| {
            let f = fleet.get_or_insert_with(|| long_prompt_fleet(&tokio, &earlier));
            let rt = &f.rt;
            let tok = &rt.endpoints[0]
                .config
                .routing
                .kv
                .as_ref()
                .unwrap()
                .tokenizer;
            let headers = HeaderMap::new();
            let bytes = Bytes::from(serde_json::to_vec(&with("fixed")).unwrap());
            let a =
                kvgate::request::analyse(rt, Api::Chat, None, &headers, bytes, "tenant").unwrap();
            let (loads, _) = a.input.view();
            let req = a.input.routing_request();
            let mut next = || {
                turn += 1;
                with(&tool_log(20_000 + turn, 40))
            };
            match part {
                "analyse" => b.iter_batched(
                    || Bytes::from(serde_json::to_vec(&next()).unwrap()),
                    |bytes| {
                        kvgate::request::analyse(rt, Api::Chat, None, &headers, bytes, "tenant")
                            .unwrap()
                    },
                    BatchSize::LargeInput,
                ),
                "render" => b.iter_batched(
                    next,
                    |v| tok.render_chat(&v).unwrap(),
                    BatchSize::LargeInput,
                ),
                "tokenize" => b.iter_batched(
                    next,
                    |v| tok.chat(&v, 131_072).unwrap(),
                    BatchSize::LargeInput,
                ),
                "encode_cached" => {
                    let text = tok.render_chat(&with("fixed")).unwrap();
                    b.iter(|| tok.encode(&text, false))
                }
                "encode_new_turn" => b.iter_batched(
                    || {
                        turn += 1;
                        tool_log(30_000 + turn, 40)
                    },
                    |t| tok.encode(&t, false),
                    BatchSize::SmallInput,
                ),
                "view" => b.iter(|| a.input.view()),
                _ => b.iter(|| a.input.endpoint.policy.plan(black_box(&req), &loads)),
            }
        });
    }
    g.finish();
}

/// The fleet of [`kv_aware_long_prompt`]: 7 instances for each of its
/// endpoints, full, the holder holding the blocks of the `earlier` turns,
/// and the previous request (those turns alone) decided once, so that their
/// segments are in the gateway's tokenizer cache.
fn long_prompt_fleet(tokio: &tokio::runtime::Runtime, earlier: &[serde_json::Value]) -> Fleet {
    let tok = kvgate_tokenize::PromptTokenizer::load(TOKENIZER, None).unwrap();
    let seen = serde_json::json!({"model": "kv", "messages": earlier});
    let ids = tok.chat(&seen, usize::MAX).unwrap().ids;
    let new_turn = tool_log(10_001, 40);
    eprintln!(
        "agent prompt: {} tokens before the new turn ({} bytes of JSON); a new turn {} tokens ({} bytes)",
        ids.len(),
        serde_json::to_vec(&seen).unwrap().len(),
        tok.encode(&new_turn, false).len(),
        new_turn.len()
    );
    let f = live_fleet(
        tokio,
        7,
        &[
            ("kv", "strategy: kv_aware, max_prompt_blocks: 2048"),
            ("kvdefault", "strategy: kv_aware"),
            ("lp", "strategy: longest_prefix, max_prompt_blocks: 2048"),
        ],
    );
    let headers = HeaderMap::new();
    for ep in &f.rt.endpoints {
        let model = ep.name();
        let bytes = Bytes::from(
            serde_json::to_vec(&serde_json::json!({"model": model, "messages": earlier})).unwrap(),
        );
        let a = kvgate::request::analyse(&f.rt, Api::Chat, None, &headers, bytes.clone(), "tenant")
            .unwrap();
        // The earlier turns' blocks, short of the last (the generation prompt's).
        let blocks = (ids.len() / 16).saturating_sub(1);
        fill_fleet(ep, &ids, blocks, &a.input.chain);
        let plan = decide(&f.rt, bytes);
        assert_eq!(plan.reason, kvgate_routing::Reason::CacheHit, "{model}");
    }
    f
}

criterion_group!(
    benches,
    kv_aware_decision,
    kv_aware_at_scale,
    kv_aware_long_prompt,
    kv_aware_long_prompt_parts
);
criterion_main!(benches);
