//! `agents.md`: how it was run, the workload and where its shape comes from,
//! one table of every strategy over every API shape, and each strategy's
//! figures over Messages and keyed chat against its figures over plain chat.

use std::fmt::Write as _;

use crate::matrix::report::load_average;
use crate::regime::Api;
use crate::report::{Context, ms};
use crate::{RunResult, WorkloadResult};

/// The whole report over `results` (one an API, in run order).
pub fn markdown(ctx: &Context, build: &str, results: &[WorkloadResult], elapsed_s: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Coding agents through kvgate: every strategy over chat (with and without a session hint) and Messages\n"
    );
    let _ = writeln!(
        s,
        "Written by `kvgate-loadbench --agents` (`crates/kvgate-bench`, `src/agents/`), for \
         issue 21.\n"
    );
    let _ = writeln!(s, "- Command: `{}`", ctx.command);
    let _ = writeln!(s, "- Date: {}", ctx.date);
    let _ = writeln!(s, "- Machine: {}", ctx.machine);
    let _ = writeln!(s, "- Build: {build}");
    let _ = writeln!(
        s,
        "- Wall time {:.1} min; load average (1, 5, 15 min) at the end: {}\n",
        elapsed_s / 60.0,
        load_average()
    );
    workload(&mut s, results);
    table(&mut s, results);
    against_chat(&mut s, results);
    s
}

fn workload(s: &mut String, results: &[WorkloadResult]) {
    let _ = writeln!(s, "## The workload\n");
    if let Some(w) = results.first() {
        let _ = writeln!(s, "{}\n", w.description);
    }
    let _ = writeln!(
        s,
        "Its shape follows the published coding-agent traces (`coding_agent.rs`, and \
         `shared/papers.md`, \"Agent traffic\"): the SemiAnalysis/WEKA Claude Code traces \
         (every request resends a ~10k-token system-and-tools prefix, sessions grow to tens \
         of thousands of tokens over dozens of turns, sub-agents branch off them, 96–98% of \
         prompt blocks reusable on one infinite cache), the Mooncake FAST'25 tool-and-agent \
         trace (mean input 8,596 tokens) and llm-d's Claude Code run (91.4% prefill hit \
         against a 93.9% ceiling). Tool results dominate each session's growth; answers are \
         tool calls.\n"
    );
    let _ = writeln!(
        s,
        "*openai*: each turn a `POST /v1/chat/completions` with the whole history (the \
         shared prefix as the system message). *openai-keyed*: the same with \
         `prompt_cache_key` = the session's id (shared by its sub-agents), as agent \
         clients that set it send it (Codex does); kvgate takes it as the session's \
         partition, so a prompt matches only what its own session sent. *messages*: each turn a `POST /v1/messages` \
         as Claude Code sends it (`x-api-key`, `anthropic-version: 2023-06-01`, `max_tokens`, \
         the shared prefix as the top-level `system`, a tool result as a `tool_result` block \
         answering the previous answer, which goes back as a `tool_use` block, \
         `metadata.user_id` = the session's id, shared by its sub-agents). The instances \
         (`kvgate-sim`) convert a Messages request to the chat prompt vLLM 0.32 renders for \
         it, so both APIs carry the same conversations; their prompts differ only in how a \
         tool call and its result are framed.\n"
    );
    let _ = writeln!(
        s,
        "Every (API, strategy) run gets a fresh fleet and gateway, in one process on \
         127.0.0.1: open loop (sessions at their Poisson times, tool run times between \
         turns), `stream: true`, `cache_tokens` configured. *cached* is the instances' own \
         cached ÷ prompt tokens; *ceiling* the same requests (the first strategy's bodies, \
         in send order) on one instance with an infinite cache; `kv_aware`'s instances \
         tokenize with SmolLM2 and count those tokens, so its share is against the ceiling \
         counted the same way. *P50 / P90 TTFT*: each request's time from arrival at its \
         instance to its first token on the simulated clock, exact. *client P90*: the time \
         to the first SSE event as the client saw it, which also holds the real overheads \
         (HTTP, the gateway, tokenizing for `kv_aware`) of this shared machine magnified by \
         1/time_scale. *req/s*: completed requests per simulated second, each session \
         replayed on its requests' engine times. *moved*: requests the gateway sent away \
         from the instance holding most of their prefix (`overflow`, `cache_spread`). \
         *sessions kept*: sessions (a sub-agent counts with its session) whose every \
         request was answered by one instance. *shares*: the least and most loaded \
         instance's share of requests (0% is an idle instance). *wall*: real seconds of \
         the run.\n"
    );
}

fn table(s: &mut String, results: &[WorkloadResult]) {
    let _ = writeln!(s, "## Results\n");
    let _ = writeln!(
        s,
        "| API | strategy | cached | ceiling | of ceiling | P50 TTFT | P90 TTFT | client P90 | req/s | moved | sessions kept | shares min–max | wall | failed |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for w in results {
        for r in &w.runs {
            let _ = writeln!(
                s,
                "| {} | {} | {:.1}% | {:.1}% | {:.1}% | {} | {} | {} | {} | {} | {} of {} | {} | {:.1} s | {} |",
                w.regime.api,
                r.arm.label(),
                100.0 * r.hit_rate,
                100.0 * w.ceiling_of(r.arm),
                100.0 * w.of_ceiling(r),
                ms(r.engine_ttft_exact.0),
                ms(r.engine_ttft_exact.1),
                ms(r.ttft_p90),
                r.engine_requests_per_s
                    .map_or_else(|| "–".to_owned(), |x| format!("{x:.2}")),
                r.moved(),
                r.chains_kept.0,
                r.chains_kept.1,
                shares(&r.shares),
                r.wall.as_secs_f64(),
                failed(r),
            );
        }
    }
    let _ = writeln!(s);
}

/// The least and most loaded instance's share of requests, in percent.
fn shares(shares: &[f64]) -> String {
    let (lo, hi) = shares
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    if shares.is_empty() {
        return "–".to_owned();
    }
    format!("{:.1}–{:.1}%", 100.0 * lo, 100.0 * hi)
}

fn failed(r: &RunResult) -> String {
    match &r.first_error {
        Some(e) if r.failed > 0 => format!("{} ({})", r.failed, e.replace('|', "/")),
        _ => r.failed.to_string(),
    }
}

/// Each strategy over Messages, and over chat with a session hint, against
/// itself over plain chat.
fn against_chat(s: &mut String, results: &[WorkloadResult]) {
    let by_api = |api: Api| results.iter().find(|w| w.regime.api == api);
    let Some(chat) = by_api(Api::OpenAi) else {
        return;
    };
    let others: Vec<&WorkloadResult> = [Api::Messages, Api::OpenAiKeyed]
        .into_iter()
        .filter_map(by_api)
        .collect();
    if others.is_empty() {
        return;
    }
    let _ = writeln!(s, "## Against plain chat, strategy by strategy\n");
    let _ = writeln!(
        s,
        "| API | strategy | of ceiling (chat → this) | P90 TTFT (chat → this) | client P90 (chat → this) | shares (chat → this) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for other in others {
        for m in &other.runs {
            let Some(c) = chat.run(m.arm) else {
                continue;
            };
            let _ = writeln!(
                s,
                "| {} | {} | {:.1}% → {:.1}% | {} → {} | {} → {} | {} → {} |",
                other.regime.api,
                m.arm.label(),
                100.0 * chat.of_ceiling(c),
                100.0 * other.of_ceiling(m),
                ms(c.engine_ttft_exact.1),
                ms(m.engine_ttft_exact.1),
                ms(c.ttft_p90),
                ms(m.ttft_p90),
                shares(&c.shares),
                shares(&m.shares),
            );
        }
    }
    let _ = writeln!(
        s,
        "\nWhat differs between the API shapes is the session hint. Over Messages the \
         gateway keys `prefix_aware` by `metadata.user_id` instead of the prompt's first \
         `prefix_length` characters, so the sessions spread over the ring, each from its \
         first turn on its own instance until that instance's bounded load sends it on \
         (at this load a few requests an instance, which moves almost every session at \
         some turn: *sessions kept*); `longest_prefix` and `kv_aware` start each session \
         on the instance where the fewest sessions started lately (of those within its \
         prompt of the cheapest). Keyed chat's `prompt_cache_key` is a partition: it \
         keys `prefix_aware` by session too, and `longest_prefix` and `kv_aware` match a \
         prompt only against what its own session sent, and start its first turn as \
         Messages' by count. Over plain chat every session has the one key of the shared \
         system-and-tools prefix, so `prefix_aware` piles them onto one instance until \
         its bounded load sends them on (*moved*), away from their histories; and nothing \
         tells one session from another before its first answer, so `longest_prefix` and \
         `kv_aware` start each where the shared prefix is already held and cheapest, and \
         move it on an early turn to the ring instance its opening and first question \
         name when the instance it would otherwise go to is busier, \
         which leaves no instance idle (*shares*). On every shape, the balance \
         cap does not bind a session's turn on the instance holding its history past the \
         shared prefix: it moves when that instance's queue outweighs recomputing the \
         history.\n"
    );
}
