//! The SVG chart, written by hand (no plotting dependency): three panels of
//! grouped bars, one group a workload, one bar a strategy — KV hit rate (with
//! the ceiling marked), and P50 and P90 TTFT as a percentage of `random`'s.

use std::fmt::Write as _;

use crate::{Arm, RunResult, WorkloadResult};

const PANEL_W: f64 = 380.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 50.0;
const TOP: f64 = 66.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 6] = [
    "#9e9e9e", "#64b5f6", "#ffb74d", "#2e7d32", "#a5d6a7", "#7b1fa2",
];

struct Panel {
    title: &'static str,
    max: f64,
    value: fn(&WorkloadResult, &RunResult) -> Option<f64>,
    /// Draw each workload's ceiling as a dashed line.
    ceiling: bool,
}

/// The chart for `results`, with `subtitle` (date, command) under the title.
pub fn svg(results: &[WorkloadResult], subtitle: &str) -> String {
    let panels = [
        Panel {
            title: "KV cache hit rate (%) — dashed: ceiling",
            max: 100.0,
            value: |_, r| Some(100.0 * r.hit_rate),
            ceiling: true,
        },
        Panel {
            title: "P50 TTFT, % of random's",
            max: 125.0,
            value: |w, r| relative(w, r, |x| x.ttft_p50),
            ceiling: false,
        },
        Panel {
            title: "P90 TTFT, % of random's",
            max: 125.0,
            value: |w, r| relative(w, r, |x| x.ttft_p90),
            ceiling: false,
        },
    ];
    let width = LEFT + panels.len() as f64 * (PANEL_W + LEFT) + 20.0;
    let height = TOP + PANEL_H + BOTTOM + 40.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="14" font-weight="bold">kvgate routing strategies on a simulated 7-instance vLLM fleet</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="34" fill="#555">{}</text>"##,
        escape(subtitle)
    );
    for (i, p) in panels.iter().enumerate() {
        let x0 = LEFT + i as f64 * (PANEL_W + LEFT);
        panel(&mut s, x0, p, results);
    }
    legend(&mut s, TOP + PANEL_H + BOTTOM + 10.0);
    s.push_str("</svg>\n");
    s
}

fn relative(w: &WorkloadResult, r: &RunResult, f: fn(&RunResult) -> f64) -> Option<f64> {
    let base = f(w.run(Arm::Random)?);
    (base > 0.0).then(|| 100.0 * f(r) / base)
}

fn panel(s: &mut String, x0: f64, p: &Panel, results: &[WorkloadResult]) {
    let y = |v: f64| TOP + PANEL_H * (1.0 - (v / p.max).clamp(0.0, 1.0));
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-weight="bold">{}</text>"#,
        x0,
        TOP - 8.0,
        escape(p.title)
    );
    for k in 0..=5 {
        let v = p.max * f64::from(k) / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{x0:.1}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{v:.0}</text>"##,
            x0 + PANEL_W,
            x0 - 4.0,
            y(v) + 4.0,
            yy = y(v),
        );
    }
    let group_w = PANEL_W / results.len().max(1) as f64;
    let bar_w = group_w * 0.8 / Arm::ALL.len() as f64;
    for (g, w) in results.iter().enumerate() {
        let gx = x0 + g as f64 * group_w + group_w * 0.1;
        for (b, arm) in Arm::ALL.iter().enumerate() {
            let Some(v) = w.run(*arm).and_then(|r| (p.value)(w, r)) else {
                continue;
            };
            let bx = gx + b as f64 * bar_w;
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} {}: {v:.1}</title></rect>"#,
                y(v),
                bar_w - 1.0,
                TOP + PANEL_H - y(v),
                COLORS[b % COLORS.len()],
                escape(&w.title()),
                arm.label(),
            );
            if v > p.max {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{v:.0}</text>"#,
                    bx + bar_w / 2.0,
                    TOP - 1.0
                );
            }
        }
        if p.ceiling {
            let cy = y(100.0 * w.ceiling);
            let _ = writeln!(
                s,
                r#"<line x1="{gx:.1}" x2="{:.1}" y1="{cy:.1}" y2="{cy:.1}" stroke="black" stroke-dasharray="4 3"/>"#,
                gx + group_w * 0.8
            );
        }
        // `mooncake-conversation` → two lines, `mooncake` over `conversation`.
        let title = w.title();
        let (first, second) = title.split_once('-').unwrap_or((&title, ""));
        for (line, text) in [first, second].into_iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                gx + group_w * 0.4,
                TOP + PANEL_H + 16.0 + 13.0 * line as f64,
                escape(text)
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<line x1="{x0:.1}" x2="{:.1}" y1="{b:.1}" y2="{b:.1}" stroke="black"/>"#,
        x0 + PANEL_W,
        b = TOP + PANEL_H
    );
}

fn legend(s: &mut String, y: f64) {
    for (i, arm) in Arm::ALL.iter().enumerate() {
        let x = LEFT + i as f64 * 210.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            y - 10.0,
            COLORS[i % COLORS.len()],
            x + 18.0,
            y,
            arm.label()
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
