//! The matrix report's text-density parts (issue 30, `--density`): what a
//! density cell is, every cell's three strategies side by side, and the
//! density the gateway learned.

use std::fmt::Write as _;

use super::verdict::{self, Verdict};
use crate::{Arm, RunResult, WorkloadResult};

/// How density cells are made, for the report's method section.
pub(super) fn method(s: &mut String) {
    let _ = writeln!(
        s,
        "Density (issue 30): *d chars/token* cells send each workload's text recoded to d \
         characters a token (`src/density.rs`): the same sessions, turns and tokens, so the \
         same caches fit, and every prefix the workload shares still shared, but code-like \
         ASCII (` x`, ` (`, ` _` pieces) at d ≥ 1.8 and CJK ideographs (3 UTF-8 bytes each) \
         below; the engines' answers (English-like words at any density) join the history \
         recoded the same way. The engines count d × (bytes a character) bytes a token: 2 \
         for code at 2, 3.9 for CJK at 1.3. The gateway's estimates start from 4 characters a token and \
         learn the engines' ratio from `usage.prompt_tokens` \
         (`kvgate_routing::units::Density`); it counts the canonical prompt's UTF-8 bytes, so \
         what it learns is bytes a token: about 2 at d = 2 (its guess 2× off), about 3.9 at \
         d = 1.3 (its guess nearly right: CJK text at 1.3 reads to it like English). \
         *gateway's bytes/token* is what it had learned by the run's end (chat template \
         included; *guess* when it had fewer than 8 usable answers: `prefix_aware` samples \
         only prompts shorter than its window). `kv_aware`'s instances tokenize with \
         SmolLM2, which splits these texts differently from the engines' d; they get that \
         ratio as more KV and prefill (`--kv-token-ratio`, measured on the recoded text and \
         given in each density section), so that they hold and prefill the same text.\n"
    );
}

/// Under a density section's heading: the engines' and `kv_aware`'s units.
pub(super) fn cell_note(s: &mut String, w: &WorkloadResult) {
    let _ = writeln!(
        s,
        "Text at {}: the engines count {} bytes a token; `kv_aware`'s count SmolLM2 tokens, \
         {:.2} a simulated token on this text, and get {:.2}× the KV blocks and prefill rate.\n",
        w.density,
        engine_bytes_per_token(w),
        w.kv_token_ratio,
        w.kv_token_ratio,
    );
}

fn engine_bytes_per_token(w: &WorkloadResult) -> String {
    format!(
        "{}",
        (w.density.bytes_per_token() * 1000.0).round() / 1000.0
    )
}

/// The gateway's learned bytes a token in `r`, or `guess`.
pub(super) fn learned(r: &RunResult) -> String {
    r.learned_bytes_per_token
        .map_or_else(|| "guess (4)".to_owned(), |b| format!("{b:.2}"))
}

/// Every cell a row: the three strategies' hit, P90 and req/s, the two
/// verdicts, and what each gateway learned.
pub(super) fn side_by_side(s: &mut String, cells: &[WorkloadResult]) {
    let _ = writeln!(s, "## Side by side\n");
    let _ = writeln!(
        s,
        "Each cell's KV hit (cached ÷ prompt tokens), P90 TTFT (whole answer without \
         streaming; instances' clock) and req/s, `prefix_aware` first; a verdict after each \
         cache-aware strategy (`kv_aware`'s against `prefix_aware` on its own tokenizing \
         instances, the column before it, where that ran); then the bytes a token each gateway had learned \
         (`prefix_aware` / `longest_prefix` / `kv_aware`).\n"
    );
    let _ = writeln!(
        s,
        "| workload | chars/token | engine bytes/token | regime | prefix_aware | longest_prefix | verdict | prefix_aware_tokens | kv_aware | verdict | learned bytes/token |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for w in cells {
        let verdicts = verdict::judge(w);
        let figures = |arm: Arm| {
            w.run(arm).map_or_else(
                || "–".to_owned(),
                |r| {
                    format!(
                        "{:.1}% · {} · {:.2}",
                        100.0 * r.hit_rate,
                        crate::report::ms(verdict::engine_p90(w, r)),
                        verdict::throughput(r)
                    )
                },
            )
        };
        let says = |arm: Arm| {
            verdicts
                .iter()
                .find(|v| v.arm == arm)
                .map_or_else(|| "–".to_owned(), short)
        };
        let learned: Vec<String> = [Arm::PrefixAware, Arm::LongestPrefix, Arm::KvAware]
            .iter()
            .map(|&a| w.run(a).map_or_else(|| "–".to_owned(), learned))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            w.setup_id,
            w.density.label(),
            engine_bytes_per_token(w),
            w.regime,
            figures(Arm::PrefixAware),
            figures(Arm::LongestPrefix),
            says(Arm::LongestPrefix),
            figures(Arm::PrefixAwareOnTokens),
            figures(Arm::KvAware),
            says(Arm::KvAware),
            learned.join(" / "),
        );
    }
    let _ = writeln!(s);
}

fn short(v: &Verdict) -> String {
    if v.won() {
        "won".to_owned()
    } else {
        format!("**lost**: {}", v.failed().join(", "))
    }
}
