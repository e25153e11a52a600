//! What the routing benchmarks share: a chat conversation of about `bytes`
//! bytes, a long system prompt then alternating turns.

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
