//! Each request of a run as one JSON line, for looking into a cell: when
//! `KVGATE_BENCH_RECORDS` names a directory, every run writes
//! `<n>-<arm>.jsonl` there (n counts the runs of this process), a line a
//! request in the order sent: its chain and turn, the instance that answered
//! (named in the response's id), its prompt and cached tokens and its TTFT on
//! the instance's clock (simulated seconds).

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::arm::Arm;
use crate::driver::Record;
use crate::readback::instance_and_serial;

static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Writes `records` when asked to; a failure to write is reported, not fatal.
pub fn dump(arm: Arm, records: &[Record]) {
    let Some(dir) = std::env::var_os("KVGATE_BENCH_RECORDS").map(PathBuf::from) else {
        return;
    };
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{n:03}-{arm:?}.jsonl"));
    let mut out = Vec::new();
    for r in records {
        let line = serde_json::json!({
            "sent_s": r.sent.as_secs_f64(),
            "chain": r.chain,
            "turn": r.turn,
            "instance": instance_and_serial(&r.outcome.id).map(|(name, _)| name),
            "prompt_tokens": r.outcome.prompt_tokens,
            "cached_tokens": r.outcome.cached_tokens,
            "engine_ttft_s": r.engine.map(|e| e.0),
            "error": r.outcome.error,
        });
        let _ = writeln!(out, "{line}");
    }
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, out)) {
        eprintln!("KVGATE_BENCH_RECORDS: cannot write {}: {e}", path.display());
    }
}
