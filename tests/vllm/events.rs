//! `kv_aware` on vLLM's own KV events: its frames decoded, prefixes warmed
//! behind the gateway's back followed, removals and clears applied, a late
//! subscriber caught up from the replay socket, salts told apart by
//! `extra_keys`, capacity learned, and the gateway's token keys equal to the
//! engine's block by block.

use serde_json::{Value, json};

use super::engines::{self, BLOCK, BLOCKS, MODEL};
use super::gateway::{
    self, KEY_A, KEY_B, TENANTS, ask, chat, document, full_blocks, held, until, usage,
};

/// How many leading blocks of `body` the engine stores (vLLM's own count).
async fn stored_blocks(fleet: &engines::Fleet, body: &Value) -> u64 {
    let mut b = body.clone();
    b["max_tokens"] = json!(1);
    let v = fleet.engines[0].post("/tokenize", &json!({"model": MODEL, "messages": b["messages"], "tools": b.get("tools"), "add_generation_prompt": true})).await;
    full_blocks(v["count"].as_u64().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_warmed_behind_the_gateways_back_are_followed_from_vllms_frames() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    // Capacity from vllm:cache_config_info: 80 blocks of 32 tokens.
    crate::common::eventually("capacity learned from vllm:cache_config_info", || {
        gw.instances()
            .iter()
            .all(|i| i.learned_cache_tokens() == Some(BLOCKS * BLOCK))
    })
    .await;
    for (n, id) in ["e1", "e0", "e1", "e0"].iter().enumerate() {
        let doc = document(&format!("warmed {n}"), 300);
        let body = ask(&doc, "What is the first word?");
        let want = stored_blocks(fleet, &body).await;
        assert!(want >= 8, "the document is too short: {want} blocks");
        // Straight to the engine: the gateway learns of it only by events.
        fleet.engine(id).post("/v1/chat/completions", &body).await;
        let v = until(&gw, None, &body, "the warmed prefix in the events", |v| {
            held(v, id) >= want
        })
        .await;
        assert_eq!(v["chosen"], *id, "{v:#}");
        assert_eq!(v["reason"], "cache_hit");
        let (prompt, cached) = usage(&chat(&gw, None, &body).await);
        assert!(
            cached >= (want - 1) * BLOCK as u64,
            "{id}: {cached} of {prompt} prompt tokens cached"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_subscriber_catches_up_from_vllms_replay_socket() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let body = ask(&document("replayed", 300), "Summarise.");
    let want = stored_blocks(fleet, &body).await;
    fleet.engine("e1").post("/v1/chat/completions", &body).await;
    // The gateway starts after the fact: only the replay socket has it.
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let v = until(&gw, None, &body, "the prefix replayed", |v| {
        held(v, "e1") >= want
    })
    .await;
    let e1 = &v["instances"][1]["kv_events"];
    assert!(e1["replays"].as_u64().unwrap_or(0) >= 1, "{v:#}");
    assert_eq!(v["chosen"], "e1");
}

/// An instance's feed state in an explanation.
fn state(v: &Value, id: &str) -> String {
    v["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["id"] == id))
        .and_then(|i| i["kv_events"]["state"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_is_known_empty_within_3s_of_coming_back_with_nothing_sent_to_it() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let body = ask(
        &document("before the restart", 300),
        "What is the first word?",
    );
    let want = stored_blocks(fleet, &body).await;
    fleet.engine("e1").post("/v1/chat/completions", &body).await;
    until(&gw, None, &body, "the prefix on e1", |v| {
        held(v, "e1") >= want
    })
    .await;

    // A rolling update: e1 stops and a new engine starts at the same ports,
    // its cache empty and its batches numbered from 0. Nothing is sent to it:
    // the gateway must find out by itself.
    let e1 = fleet.engine("e1");
    e1.stop().await;
    until(&gw, None, &body, "e1's publisher gone", |v| {
        state(v, "e1") == "disconnected"
    })
    .await;
    e1.start_again().await;
    let back = std::time::Instant::now();
    let v = until(&gw, None, &body, "e1 known empty from its events", |v| {
        state(v, "e1") == "events"
    })
    .await;
    let took = back.elapsed();
    // The recovery time, for `--nocapture` runs that quote it.
    eprintln!("restarted e1 known empty from its events {took:?} after /health answered");
    let at_e1 = v["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["id"] == "e1"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(at_e1["source"], "events", "{v:#}");
    assert_eq!(held(&v, "e1"), 0, "{v:#}");
    assert!(at_e1["kv_events"]["resets"].as_u64() >= Some(1), "{v:#}");
    assert_ne!(v["reason"], "cache_hit", "{v:#}");
    assert!(
        took < std::time::Duration::from_secs(3),
        "{took:?} after /health answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_removed_after_eviction_moves_traffic_to_the_engine_still_holding() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let body = ask(&document("evicted", 300), "Summarise.");
    let want = stored_blocks(fleet, &body).await;
    for e in &fleet.engines {
        e.post("/v1/chat/completions", &body).await;
    }
    until(&gw, None, &body, "both engines holding it", |v| {
        held(v, "e0") >= want && held(v, "e1") >= want
    })
    .await;
    // Fill e0's 80 blocks with other prompts: vLLM evicts the document.
    for n in 0..6 {
        let other = ask(&document(&format!("filler {n}"), 450), "Go.");
        fleet
            .engine("e0")
            .post("/v1/chat/completions", &other)
            .await;
    }
    let v = until(&gw, None, &body, "BlockRemoved applied", |v| {
        held(v, "e0") < want
    })
    .await;
    assert_eq!(
        (v["chosen"].as_str(), v["reason"].as_str()),
        (Some("e1"), Some("cache_hit")),
        "{v:#}"
    );
    let (prompt, cached) = usage(&chat(&gw, None, &body).await);
    assert!(cached >= (want - 1) * BLOCK as u64, "{cached} of {prompt}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prefix_cache_is_seen_as_all_blocks_cleared() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let body = ask(&document("cleared", 300), "Summarise.");
    chat(&gw, None, &body).await;
    let v = until(&gw, None, &body, "the prefix held", |v| {
        held(v, "e0") + held(v, "e1") >= 8
    })
    .await;
    let holder = v["chosen"].as_str().unwrap().to_owned();
    // Reset, and one step for vLLM to publish AllBlocksCleared.
    fleet.engine(&holder).empty_cache().await;
    until(&gw, None, &body, "AllBlocksCleared applied", |v| {
        held(v, &holder) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_salts_keep_identical_prompts_apart_on_the_engine_and_in_the_index() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    // One engine, so that both tenants' requests meet the same cache.
    let gw = gateway::start(fleet, &["e0"], "kv_aware", TENANTS).await;
    let body = ask(&document("shared by two tenants", 300), "Summarise.");
    let want = stored_blocks(fleet, &body).await;
    let mut cached = Vec::new();
    for key in [KEY_A, KEY_A, KEY_B, KEY_B] {
        let (_, c) = usage(&chat(&gw, Some(key), &body).await);
        cached.push(c);
    }
    let warm = (want - 1) * BLOCK as u64;
    assert!(
        cached[0] == 0 && cached[1] >= warm && cached[2] == 0 && cached[3] >= warm,
        "cached tokens a, a, b, b: {cached:?} (want 0, ≥{warm}, 0, ≥{warm})"
    );
    // The events carry each tenant's cache_salt (extra_keys): tenant a's
    // blocks count for a; an unknown tenant's identical prompt holds none.
    let a = until(&gw, Some(KEY_A), &body, "tenant a's blocks", |v| {
        held(v, "e0") >= want
    })
    .await;
    assert!(held(&a, "e0") >= want);
    let gw2 = gateway::start(
        fleet,
        &["e0"],
        "kv_aware",
        &TENANTS.replace("tenant-b", "tenant-c"),
    )
    .await;
    let c = until(&gw2, Some(KEY_B), &body, "the replayed index", |v| {
        v["instances"][0]["kv_events"]["held_blocks"]
            .as_u64()
            .unwrap_or(0)
            >= 2 * want
    })
    .await;
    assert_eq!(
        held(&c, "e0"),
        0,
        "tenant c matched others' salted blocks: {c:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_token_keys_equal_vllms_for_system_turns_and_tools() {
    let Some((_turn, fleet)) = engines::take().await else {
        return;
    };
    let gw = gateway::start(fleet, &["e0", "e1"], "kv_aware", "").await;
    let body = json!({
        "model": MODEL,
        "messages": [
            // vLLM drops Claude Code's per-request billing line from system text.
            {"role": "system", "content": format!("x-anthropic-billing-header: cc_version=2.1; cch=93a1f;\n{}", document("a system prompt", 120))},
            {"role": "user", "content": "What is the weather in Paris and in Rome?"},
            {"role": "assistant", "content": "Let me look that up for you."},
            {"role": "user", "content": document("a long follow-up", 150)},
            {"role": "assistant", "content": "Paris is sunny; Rome is cloudy."},
            {"role": "user", "content": "And tomorrow?"}
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }}],
        "max_tokens": 1,
        "temperature": 0
    });
    // The same ids as the engine's own tokenizer and template.
    let engine = fleet.engines[0]
        .post(
            "/tokenize",
            &json!({"model": MODEL, "messages": body["messages"], "tools": body["tools"], "add_generation_prompt": true}),
        )
        .await;
    // The model folder as transformers writes it today: the template in
    // chat_template.jinja, none in tokenizer_config.json.
    let config = std::fs::read_to_string(fleet.model_dir().join("tokenizer_config.json")).unwrap();
    assert!(!config.contains("chat_template"), "{config}");
    let tokenizer =
        kvgate_tokenize::PromptTokenizer::load(&fleet.tokenizer().display().to_string(), None)
            .unwrap();
    let source = tokenizer.chat_template_source().unwrap_or_default();
    assert!(
        source.ends_with("chat_template.jinja"),
        "template from {source:?}"
    );
    let ours = tokenizer.chat(&body, 1 << 20).unwrap();
    let theirs: Vec<u32> = engine["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ours.ids, theirs, "the gateway renders the chat unlike vLLM");
    // Block by block: the engine's stored blocks match every one of the
    // gateway's keys (one wrong block would end the match there).
    let answer = chat(&gw, None, &body).await;
    assert_eq!(usage(&answer).0, theirs.len() as u64);
    let want = full_blocks(theirs.len() as u64);
    let v = until(&gw, None, &body, "every block matched", |v| {
        held(v, "e0").max(held(v, "e1")) >= want
    })
    .await;
    assert_eq!(v["engine_blocks"].as_u64(), Some(want), "{v:#}");
}
