//! The command line, date and machine a report names.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::report::Context;

/// This process's command, now, and this machine.
pub fn context() -> Context {
    Context {
        command: command_line(),
        date: utc_now(),
        machine: machine(),
    }
}

/// The source the gateway was built from: `git rev-parse --short HEAD`,
/// and whether `src/` had uncommitted changes (the working tree is what
/// was built). "unknown" outside a git checkout.
pub fn build() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => match git(&["status", "--porcelain", "--", "../../src"]) {
            Some(dirty) if !dirty.is_empty() => {
                format!("{head} with uncommitted changes in src/ (the working tree was built)")
            }
            _ => head,
        },
        None => "unknown".to_owned(),
    }
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cmd = "cargo run --release -p kvgate-bench --bin kvgate-loadbench --".to_owned();
    for a in args {
        cmd.push(' ');
        cmd.push_str(&a);
    }
    cmd
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock (civil-from-days, no date crate).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3_600,
        rem % 3_600 / 60
    )
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    format!(
        "{cores} logical cores ({cpu}), {} {}, shared with other work; gateway, \
         simulators and load generator in one process; {} build",
        std::env::consts::OS,
        std::env::consts::ARCH,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    )
}
