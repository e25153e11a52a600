//! What the routing benchmarks share: a chat conversation of about `bytes`
//! bytes (a long system prompt then alternating turns), the fleet sizes the
//! decision is measured at, and a full approximate index for an instance.
#![allow(dead_code, reason = "each benchmark binary uses part of this module")]

use kvgate_routing::BlockIndex;

/// Fleet sizes the whole decision is measured at: SageMaker's 7, then up to
/// issue 31's one gateway in front of 1,000 engines.
pub const FLEETS: [usize; 4] = [7, 64, 256, 1000];

/// The messages of a conversation of about `bytes` bytes.
pub fn conversation(bytes: usize) -> Vec<serde_json::Value> {
    let system =
        "You are a meticulous assistant for the ACME support team. ".repeat(bytes / 2 / 58 + 1);
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    let mut used = system.len();
    let mut turn = 0;
    while used < bytes {
        let text = format!("Turn {turn}: could you explain the previous answer in more detail? ")
            .repeat(20);
        used += text.len();
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": text}));
        turn += 1;
    }
    messages
}

/// The YAML `instances:` lines of `n` instances, instance `i`'s mapping
/// completed by `extra(i)` (e.g. `, kv_events: "tcp://…"`).
pub fn instances_yaml(n: usize, extra: impl Fn(usize) -> String) -> String {
    (0..n)
        .map(|i| {
            format!(
                "      - {{ url: \"http://10.{}.{}.{}:8000\"{} }}\n",
                i / 65_536,
                i / 256 % 256,
                i % 256,
                extra(i)
            )
        })
        .collect()
}

/// Shared system prompts in the whole fleet; each instance holds a few.
pub const SHARED_PROMPTS: u64 = 64;
/// Shared prompts each instance holds conversations under.
pub const PROMPTS_AN_INSTANCE: u64 = 4;

/// Fill instance `i`'s approximate index to its capacity, as its own
/// dispatches would: conversations of 48 blocks (12,288 characters at
/// 256 a block), each the first 16 blocks of one of the fleet's
/// [`SHARED_PROMPTS`] system prompts (the instance's [`PROMPTS_AN_INSTANCE`]
/// of them, so other instances hold the same blocks) and 32 of its own.
pub fn fill_index(index: &BlockIndex, i: u64) {
    let cap = index.capacity();
    let key = |a: u64, b: u64| (a << 24 ^ b).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995;
    let mut chain = Vec::with_capacity(48);
    let mut c = 0u64;
    // A quarter more distinct blocks than it holds: full, and it has evicted.
    while c * 32 < (cap as u64) * 5 / 4 {
        let prompt = (i + (c % PROMPTS_AN_INSTANCE) * 17) % SHARED_PROMPTS;
        chain.clear();
        chain.extend((0..16).map(|b| key(prompt, b)));
        chain.extend((0..32).map(|b| key((1 << 20) + i * 4096 + c, b)));
        index.insert(&chain);
        c += 1;
    }
}
