//! Proxy cost side by side: the same chat requests sent to a fixed-answer
//! nginx upstream directly, through nginx and HAProxy as reverse proxies, and
//! through kvgate (`prefix_aware` and `longest_prefix`), interleaved over
//! rounds: open-loop latency at fixed rates, closed-loop throughput, CPU a
//! request and RSS of each proxy, ratios to nginx first; then kvgate's (and
//! nginx's) memory with 1,000 and 10,000 open SSE streams.
//!
//! `cargo bench --bench overhead` (full, ~6 min; writes
//! `bench/results/overhead.md` unless `-- --no-write`), `-- --quick` (~30 s
//! smoke, writes nothing), `-- --memory` (the open-stream test alone, printed
//! only). `KVGATE_BASELINE=path/to/kvgate` adds that build (`prefix_aware`)
//! as one more path of the same run, to compare a change's before and after.
//! Needs Debian's nginx and haproxy
//! (`apt-get install nginx haproxy`); without them their rows are skipped.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark driver"
)]

mod configs;
mod load;
mod memory;
mod procs;
mod report;
mod streams;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use load::Conn;
use procs::Proc;
use report::{ClosedCell, OpenCell, Results};

/// The path with one console viewer attached.
const CONSOLE_VIEWER: &str = "kvgate prefix_aware, one console viewer";

/// One browser's worth of console: `/console/api/events` read and dropped
/// for as long as the run lasts (a `state` sample a second, and the
/// decisions of every request).
async fn console_viewer(port: u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let head = format!(
        "GET /console/api/events HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\naccept: text/event-stream\r\n\r\n",
        configs::CONSOLE_TOKEN
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = true;
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if first {
            assert!(
                buf.starts_with(b"HTTP/1.1 200"),
                "the console viewer was refused"
            );
            first = false;
        }
    }
}

/// The path name of `KVGATE_BASELINE`'s build.
const BASELINE: &str = "kvgate prefix_aware, baseline build";

/// How much of everything to run.
struct Plan {
    rounds: usize,
    rates: Vec<u64>,
    open_secs: f64,
    /// Closed loop: warm-up, then the measured window, seconds.
    closed: (f64, f64),
    streams: Vec<usize>,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                rounds: 1,
                rates: vec![2000],
                open_secs: 1.0,
                closed: (0.2, 0.6),
                streams: vec![100],
            }
        } else {
            Plan {
                rounds: 3,
                rates: vec![2000, 5000],
                open_secs: 4.0,
                closed: (0.3, 2.0),
                streams: vec![1_000, 10_000],
            }
        }
    }
}

/// One path under test: where to send, and the proxy process to measure.
struct Target {
    name: &'static str,
    port: u16,
    proc: Option<Proc>,
    conns: Vec<Conn>,
}

/// Open-loop connections a path gets: far above what 5,000 req/s of
/// sub-millisecond answers keep busy, so queueing shows as latency, not as a
/// cap on the rate.
const OPEN_CONNS: usize = 32;
const CLOSED_CONNS: usize = 64;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Target {
    fn new(name: &'static str, port: u16, proc: Option<Proc>) -> Self {
        let conns = (0..OPEN_CONNS).map(|_| Conn::new(addr(port))).collect();
        Target {
            name,
            port,
            proc,
            conns,
        }
    }
}

/// A chat request of about `bytes` bytes: a system prompt of that size and a
/// short question.
fn chat_body(bytes: usize) -> Bytes {
    let question = "Summarise the difference between a reverse proxy and a load balancer in two sentences, please.";
    let shell = |system: &str| {
        serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "max_tokens": 64,
            "temperature": 0.2,
        })
        .to_string()
    };
    let base = "You are a concise assistant for the ACME support team. ";
    let pad = bytes.saturating_sub(shell(base).len());
    let filler = "Answer from the policy handbook and cite the section you used. ";
    let mut system = base.to_owned();
    while system.len() < base.len() + pad {
        system.push_str(filler);
    }
    system.truncate(base.len() + pad);
    Bytes::from(shell(&system))
}

fn us_per_request(ticks: Option<(u64, u64)>, tck: f64, n: u64) -> Option<f64> {
    ticks.map(|(a, b)| (b.saturating_sub(a)) as f64 / tck * 1e6 / n.max(1) as f64)
}

fn cmd_out(cmd: &str, args: &[&str]) -> Option<String> {
    let o = std::process::Command::new(cmd).args(args).output().ok()?;
    let s = String::from_utf8(o.stdout).ok()?.trim().to_owned();
    (o.status.success() && !s.is_empty()).then_some(s)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let write = !quick && !args.iter().any(|a| a == "--no-write");
    let plan = Plan::new(quick);
    let tck = procs::clk_tck();
    let dir = std::env::temp_dir().join(format!("kvgate-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let nginx = procs::find_bin("nginx");
    let haproxy = procs::find_bin("haproxy");
    for (name, bin) in [("nginx", &nginx), ("haproxy", &haproxy)] {
        if bin.is_none() {
            println!(
                "{name} not found: its rows are skipped (install with `apt-get install nginx haproxy`)"
            );
        }
    }
    let (release, release_rx) = tokio::sync::watch::channel(0u64);
    let inproc = streams::start_upstream(release_rx).await;
    if args.iter().any(|a| a == "--memory") {
        memory::run(&dir, nginx.as_deref(), inproc, &plan.streams, &release).await;
        std::fs::remove_dir_all(&dir).ok();
        return;
    }
    // The fixed-answer upstream: nginx, else (without nginx) the in-process one.
    let up_port = procs::free_port();
    let upstream = nginx.as_ref().map(|bin| {
        let conf = configs::nginx_upstream(&dir, up_port);
        procs::nginx(bin, &dir, "upstream", &conf, up_port)
    });
    let up_port = if upstream.is_some() { up_port } else { inproc };
    let up_url = format!("http://127.0.0.1:{up_port}");

    let mut targets = vec![Target::new(report::DIRECT, up_port, None)];
    if let Some(bin) = &nginx {
        let port = procs::free_port();
        let conf = configs::nginx_proxy(&dir, port, up_port);
        let p = procs::nginx(bin, &dir, "proxy", &conf, port);
        targets.push(Target::new(report::NGINX, port, Some(p)));
    }
    if let Some(bin) = &haproxy {
        let port = procs::free_port();
        let p = procs::haproxy(bin, &dir, &configs::haproxy(port, up_port), port);
        targets.push(Target::new("haproxy", port, Some(p)));
    }
    for (name, strategy) in [
        ("kvgate prefix_aware", "prefix_aware"),
        ("kvgate longest_prefix", "longest_prefix"),
    ] {
        let port = procs::free_port();
        let conf = configs::kvgate(port, &up_url, strategy);
        let p = procs::kvgate(&dir, strategy, &conf, port);
        targets.push(Target::new(name, port, Some(p)));
    }
    // The console's cost with someone watching: the same build and config
    // (plus an admin token), one viewer on its event stream throughout.
    let _viewer = {
        let port = procs::free_port();
        let conf = configs::kvgate_console(port, &up_url, "prefix_aware");
        let p = procs::kvgate(&dir, "console", &conf, port);
        targets.push(Target::new(CONSOLE_VIEWER, port, Some(p)));
        tokio::spawn(console_viewer(port))
    };
    // Another build of kvgate in the same run (the "before" of a change),
    // measured cell by cell beside this one.
    if let Ok(bin) = std::env::var("KVGATE_BASELINE") {
        let port = procs::free_port();
        let conf = configs::kvgate(port, &up_url, "prefix_aware");
        let p = procs::kvgate_at(Path::new(&bin), &dir, "baseline", &conf, port);
        targets.push(Target::new(BASELINE, port, Some(p)));
    }

    let bodies = [("small", chat_body(300)), ("16 KiB", chat_body(16 * 1024))];
    let mut res = Results {
        bodies: bodies.iter().map(|(n, b)| (*n, b.len())).collect(),
        rates: plan.rates.clone(),
        paths: targets.iter().map(|t| t.name).collect(),
        ..Results::default()
    };
    let cells = plan.rates.len() * bodies.len() * targets.len();
    println!(
        "{} paths, {} rounds of {cells} open-loop cells ({} s each) and {} closed-loop cells; CLK_TCK {tck}",
        targets.len(),
        plan.rounds,
        plan.open_secs,
        bodies.len() * targets.len()
    );
    // Warm every path: connections open, first-request costs paid.
    for t in &mut targets {
        for (_, body) in &bodies {
            load::open_loop(&mut t.conns, body, 500.0, 0.4).await;
        }
    }

    let up_ticks = || upstream.as_ref().map(Proc::cpu_ticks);
    for round in 0..plan.rounds {
        let mut cell = round;
        for (b, (bname, body)) in bodies.iter().enumerate() {
            for (r, &rate) in plan.rates.iter().enumerate() {
                for p in rotated(targets.len(), cell) {
                    let t = &mut targets[p];
                    let (c0, u0) = (t.proc.as_ref().map(Proc::cpu_ticks), up_ticks());
                    let o = load::open_loop(&mut t.conns, body, rate as f64, plan.open_secs).await;
                    let (c1, u1) = (t.proc.as_ref().map(Proc::cpu_ticks), up_ticks());
                    let n = o.lat_us.len() as u64;
                    let c = OpenCell {
                        p50: report::pct(&o.lat_us, 0.5),
                        p99: report::pct(&o.lat_us, 0.99),
                        p999: report::pct(&o.lat_us, 0.999),
                        achieved: o.achieved,
                        errors: o.errors,
                        cpu_us: us_per_request(c0.zip(c1), tck, n),
                        up_cpu_us: us_per_request(u0.zip(u1), tck, n).unwrap_or(f64::NAN),
                    };
                    println!(
                        "round {} {bname:>6} {rate:>5}/s {:<22} p50 {:.3} p99 {:.3} p99.9 {:.3} ms  {:.0}/s  err {}  CPU {}/req",
                        round + 1,
                        t.name,
                        c.p50 / 1e3,
                        c.p99 / 1e3,
                        c.p999 / 1e3,
                        c.achieved,
                        c.errors,
                        c.cpu_us.map_or("—".into(), |x| format!("{x:.1} µs")),
                    );
                    res.open.entry((b, r, p)).or_default().push(c);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                cell += 1;
            }
        }
        for (b, (bname, body)) in bodies.iter().enumerate() {
            for p in rotated(targets.len(), cell) {
                let t = &targets[p];
                let sample = || t.proc.as_ref().map(Proc::cpu_ticks);
                let (rps, n, c0, c1) =
                    load::closed_loop(addr(t.port), body, CLOSED_CONNS, plan.closed, sample).await;
                let c = ClosedCell {
                    rps,
                    cpu_us: us_per_request(c0.zip(c1), tck, n),
                };
                println!(
                    "round {} {bname:>6} closed loop {:<22} {rps:.0} req/s  CPU {}/req",
                    round + 1,
                    t.name,
                    c.cpu_us.map_or("—".into(), |x| format!("{x:.1} µs")),
                );
                res.closed.entry((b, p)).or_default().push(c);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            cell += 1;
        }
    }
    for t in &targets {
        if let Some(p) = &t.proc {
            res.rss.push((t.name, p.rss_kib()));
        }
    }
    if let Some(u) = &upstream {
        res.rss.push(("upstream nginx", u.rss_kib()));
    }
    drop(targets);

    let mem = memory::run(&dir, nginx.as_deref(), inproc, &plan.streams, &release).await;
    let headline = res.headline();
    let full = res.full();
    println!("\n{headline}\n{full}");
    if write {
        let up = if upstream.is_some() {
            "the same nginx upstream answering a fixed chat.completion from memory (one process, no access log)"
        } else {
            "the same in-process upstream answering a fixed chat.completion (nginx was not installed)"
        };
        write_report(&plan, up, &headline, &full, &mem);
    }
    drop(upstream);
    std::fs::remove_dir_all(&dir).ok();
}

/// Indices 0..n starting at `k % n`: each cell visits the paths in a new order.
fn rotated(n: usize, k: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + k) % n)
}

fn write_report(plan: &Plan, upstream: &str, headline: &str, full: &str, mem: &str) {
    let root = env!("CARGO_MANIFEST_DIR");
    let commit = cmd_out("git", &["-C", root, "rev-parse", "--short", "HEAD"])
        .unwrap_or_else(|| "unknown".into());
    let dirty = cmd_out(
        "git",
        &["-C", root, "status", "--porcelain", "--untracked-files=no"],
    )
    .map_or("", |_| " (with uncommitted changes)");
    let when = cmd_out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let md = format!(
        "# Proxy overhead, side by side\n\n\
         Command: `cargo bench --bench overhead`  \n\
         Machine: {cores} cores ({cpu}), shared; load generator, upstream and proxies on the same machine.  \n\
         Commit: {commit}{dirty}; run of {when}.\n\n\
         Method: every path sits in front of {upstream}. Open loop: request i is due at start + i/rate and its \
         latency runs from that due time (no coordinated omission), {secs} s a cell over {OPEN_CONNS} \
         keep-alive connections; closed loop: {CLOSED_CONNS} connections back to back for {closed} s. \
         {rounds} rounds, every (body, rate, path) cell once a round with the paths in rotating order; \
         figures are medians over rounds, *added* is the path minus direct in the same round. CPU is \
         utime+stime of the proxy's process from `/proc/PID/stat` over the cell ÷ completed requests. \
         nginx: one process and worker, no access log (as kvgate by default), `proxy_http_version 1.1`, upstream \
         `keepalive`, default buffering, `client_body_buffer_size 64k`; HAProxy: `nbthread 1`, \
         `mode http`, `http-reuse always`; kvgate: `serve` at its default log settings (stdout to \
         /dev/null), `concurrency_threshold` 1024.\n\n\
         ## Headline\n\n{headline}\n## All cells\n\n{full}\n## Open streams\n\n{mem}",
        secs = plan.open_secs,
        closed = plan.closed.1,
        rounds = plan.rounds,
    );
    let out = Path::new(root).join("bench/results/overhead.md");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, md).unwrap();
    println!("wrote {}", out.display());
}
