//! kvgate in front of real vLLM: two vLLM 0.32 engines (the CPU build, from
//! PyPI) serving SmolLM2-135M on 127.0.0.1, started once for this binary by
//! `scripts/vllm.sh serve`, each with KV events on ZeroMQ, their replay
//! socket, prefix caching and a small KV cache (80 blocks of 32 tokens) that
//! evicts. Every behaviour the engine decides — which blocks it stores and
//! removes, its hashes and salts, its capacity gauge, its cached-token
//! counts, its abort on disconnect, its Responses store — is checked against
//! the engine itself, not a stand-in.
//!
//! The install comes from `scripts/vllm.sh` (cached under ~/.cache/kvgate),
//! named by `KVGATE_VLLM_SCRIPT`, `KVGATE_VLLM_PYTHON` and
//! `KVGATE_VLLM_MODEL`; `.ci/run` sets them. Without them the tests fail,
//! unless `KVGATE_SKIP_VLLM=1` opts out explicitly.
//!
//! The engines are shared, so the tests take turns (a lock) and each starts
//! from emptied caches; each runs its own gateway.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure is a failed test"
)]

mod common;

#[path = "vllm/engines.rs"]
mod engines;
#[path = "vllm/events.rs"]
mod events;
#[path = "vllm/gateway.rs"]
mod gateway;
#[path = "vllm/messages.rs"]
mod messages;
#[path = "vllm/traffic.rs"]
mod traffic;
