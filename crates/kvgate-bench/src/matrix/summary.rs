//! `matrix.md`'s summary: cells won and lost per strategy with every losing
//! cell and the criterion it failed, then cells lost by workload.

use std::fmt::Write as _;

use super::verdict::{self, JUDGED, Verdict};
use crate::WorkloadResult;

pub(super) fn summary(s: &mut String, cells: &[WorkloadResult]) {
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(
        s,
        "| strategy | cells | won | lost | lost on hit | on P90 TTFT | on throughput | on the client's P90 / req/s instead (not counted) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    let judged: Vec<(&WorkloadResult, Verdict)> = cells
        .iter()
        .flat_map(|w| verdict::judge(w).into_iter().map(move |v| (w, v)))
        .collect();
    for arm in JUDGED {
        let mine: Vec<&Verdict> = judged
            .iter()
            .filter(|(_, v)| v.arm == arm)
            .map(|(_, v)| v)
            .collect();
        let count = |f: fn(&Verdict) -> bool| mine.iter().filter(|v| f(v)).count();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            arm.label(),
            mine.len(),
            count(Verdict::won),
            count(|v| !v.won()),
            count(|v| !v.hit),
            count(|v| !v.ttft),
            count(|v| !v.throughput),
            count(|v| !v.client_ttft),
            count(|v| !v.client_throughput),
        );
    }
    let _ = writeln!(s, "\nLosing cells:\n");
    let mut any = false;
    for (w, v) in judged.iter().filter(|(_, v)| !v.won()) {
        any = true;
        let (Some(base), Some(r)) = (verdict::baseline(w, v.arm), w.run(v.arm)) else {
            continue;
        };
        let _ = writeln!(
            s,
            "- {} · {} — `{}` lost on {} against `{}`: hit {:.1}% vs {:.1}%, P90 {} vs {}, {:.2} vs {:.2} req/s",
            w.workload_label(),
            w.regime,
            v.arm.label(),
            v.failed().join(", "),
            base.arm.label(),
            100.0 * r.hit_rate,
            100.0 * base.hit_rate,
            crate::report::ms(verdict::engine_p90(w, r)),
            crate::report::ms(verdict::engine_p90(w, base)),
            verdict::throughput(r),
            verdict::throughput(base),
        );
    }
    if !any {
        let _ = writeln!(s, "- none");
    }
    let _ = writeln!(s);
}

/// Cells lost a workload, per strategy.
pub(super) fn by_workload(s: &mut String, cells: &[WorkloadResult]) {
    let _ = writeln!(s, "Cells lost, by workload:\n");
    let head: Vec<String> = JUDGED.iter().map(|a| format!(" {} |", a.label())).collect();
    let _ = writeln!(s, "| workload |{}", head.concat());
    let _ = writeln!(s, "|---|{}", "---|".repeat(JUDGED.len()));
    let mut seen: Vec<String> = Vec::new();
    for id in cells.iter().map(WorkloadResult::workload_label) {
        if seen.contains(&id) {
            continue;
        }
        seen.push(id.clone());
        let mine: Vec<&WorkloadResult> =
            cells.iter().filter(|w| w.workload_label() == id).collect();
        let counts: Vec<String> = JUDGED
            .iter()
            .map(|&arm| {
                let v: Vec<Verdict> = mine
                    .iter()
                    .flat_map(|w| verdict::judge(w))
                    .filter(|v| v.arm == arm)
                    .collect();
                format!(
                    " {} of {} |",
                    v.iter().filter(|v| !v.won()).count(),
                    v.len()
                )
            })
            .collect();
        let _ = writeln!(s, "| {id} |{}", counts.concat());
    }
    let _ = writeln!(s);
}
