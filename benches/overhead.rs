//! Gateway overhead, measured: the same requests sent to an upstream directly
//! and through a `kvgate serve` process, at several open-loop request rates,
//! in one run; the highest rate kvgate sustains on this machine; and the
//! gateway process's memory with 1,000 and 10,000 concurrent open streams.
//!
//! The upstream is a minimal OpenAI-shaped server in this process that answers
//! at once, so the difference between the two paths is the gateway alone.
//!
//! `cargo bench --bench overhead` (full, ~2 min) or `-- --quick`; writes
//! `bench/results/overhead.md` unless `--no-write`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark driver"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::routing::post;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

const BODY: &str = r#"{"model":"m","messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"Say hi."}],"max_tokens":8}"#;
const ANSWER: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":0}}}"#;

async fn answer(body: Bytes) -> axum::response::Response {
    if body.windows(14).any(|w| w == br#""stream":true"#) {
        // Hold the stream open after one event: a long generation.
        let first = futures_util::stream::once(async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"data: {\"choices\":[]}\n\n"))
        });
        let s = futures_util::StreamExt::chain(first, futures_util::stream::pending());
        return axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(s))
            .unwrap();
    }
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(ANSWER))
        .unwrap()
}

async fn start_upstream() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(l, Router::new().route("/v1/chat/completions", post(answer)))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

struct Gateway {
    child: Child,
    url: String,
}

async fn start_gateway(upstream: &str, dir: &std::path::Path) -> Gateway {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let yaml = format!(
        "server:\n  listen: \"127.0.0.1:{port}\"\n  timeouts: {{ idle_ms: 3600000 }}\n  sse_keepalive_ms: 0\nendpoints:\n  - name: chat\n    models: [\"m\"]\n    instances:\n      - url: \"{upstream}\"\n    routing: {{ strategy: prefix_aware, concurrency_threshold: 1024 }}\n"
    );
    let path = dir.join("overhead.yaml");
    std::fs::write(&path, yaml).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::new();
    for _ in 0..500 {
        if c.get(format!("{url}/health")).send().await.is_ok() {
            return Gateway { child, url };
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("kvgate did not start");
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Run {
    p50_ms: f64,
    p99_ms: f64,
    achieved: f64,
    errors: usize,
}

/// Open loop: one request every 1/rate seconds regardless of answers.
async fn open_loop(client: &reqwest::Client, url: &str, rate: u64, secs: f64) -> Run {
    let n = (rate as f64 * secs) as usize;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        tick.tick().await;
        let (c, u) = (client.clone(), format!("{url}/v1/chat/completions"));
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = c
                .post(u)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => r
                    .bytes()
                    .await
                    .ok()
                    .map(|_| t.elapsed().as_secs_f64() * 1e3),
                _ => None,
            }
        }));
    }
    let mut lat = Vec::with_capacity(n);
    let mut errors = 0;
    for t in tasks {
        match t.await.unwrap() {
            Some(ms) => lat.push(ms),
            None => errors += 1,
        }
    }
    let wall = started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Run {
        p50_ms: pct(&lat, 0.5),
        p99_ms: pct(&lat, 0.99),
        achieved: lat.len() as f64 / wall,
        errors,
    }
}

/// Closed loop: `conc` clients back to back for `secs`; requests per second.
async fn saturate(url: &str, conc: usize, secs: f64) -> f64 {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(conc)
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (c, u, done) = (
            client.clone(),
            format!("{url}/v1/chat/completions"),
            Arc::clone(&done),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let sent = c
                    .post(&u)
                    .header("content-type", "application/json")
                    .body(BODY)
                    .send();
                if let Ok(r) = sent.await
                    && r.bytes().await.is_ok()
                {
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Open `n` streams through the gateway over HTTP/2 (about 100 per
/// connection, as an ingress would multiplex them) and return the gateway's RSS.
async fn rss_with_streams(gw: &Gateway, n: usize) -> u64 {
    let per_conn = 100;
    let mut held = Vec::with_capacity(n);
    let mut clients = Vec::new();
    for _ in 0..n.div_ceil(per_conn) {
        clients.push(
            reqwest::Client::builder()
                .http2_prior_knowledge()
                .build()
                .unwrap(),
        );
    }
    let body = BODY.replace(r#""max_tokens":8"#, r#""max_tokens":8,"stream":true"#);
    let mut pending = Vec::with_capacity(n);
    for i in 0..n {
        let c = clients[i / per_conn].clone();
        let (u, b) = (format!("{}/v1/chat/completions", gw.url), body.clone());
        pending.push(tokio::spawn(async move {
            let mut r = c
                .post(u)
                .header("content-type", "application/json")
                .body(b)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
            r.chunk().await.unwrap();
            r
        }));
    }
    for p in pending {
        held.push(p.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = rss_kib(gw.child.id().unwrap_or(0));
    drop(held);
    rss
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let write = !args.iter().any(|a| a == "--no-write");
    let secs = if quick { 1.0 } else { 5.0 };
    let rates: &[u64] = if quick {
        &[200, 1000]
    } else {
        &[250, 500, 1000, 2000, 3000, 4000]
    };
    let dir = std::env::temp_dir().join(format!("kvgate-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let upstream = start_upstream().await;
    let gw = start_gateway(&upstream, &dir).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .build()
        .unwrap();
    // Warm both paths' connection pools.
    open_loop(&client, &upstream, 200, 0.5).await;
    open_loop(&client, &gw.url, 200, 0.5).await;

    let mut rows = Vec::new();
    for &rate in rates {
        let direct = open_loop(&client, &upstream, rate, secs).await;
        let via = open_loop(&client, &gw.url, rate, secs).await;
        let sustained = via.errors == 0 && via.achieved >= 0.95 * rate as f64 && via.p99_ms < 50.0;
        println!(
            "rate {rate:>5}/s  direct p50 {:.3} p99 {:.3} ms | kvgate p50 {:.3} p99 {:.3} ms | added p50 {:.3} p99 {:.3} ms | achieved {:.0}/s errors {} {}",
            direct.p50_ms,
            direct.p99_ms,
            via.p50_ms,
            via.p99_ms,
            via.p50_ms - direct.p50_ms,
            via.p99_ms - direct.p99_ms,
            via.achieved,
            via.errors,
            if sustained {
                "sustained"
            } else {
                "NOT sustained"
            }
        );
        rows.push((rate, direct, via, sustained));
    }
    let sat_secs = if quick { 1.0 } else { 5.0 };
    let sat_direct = saturate(&upstream, 64, sat_secs).await;
    let sat_via = saturate(&gw.url, 64, sat_secs).await;
    println!(
        "closed loop, 64 clients: direct {sat_direct:.0} req/s, through kvgate {sat_via:.0} req/s"
    );

    let idle_rss = rss_kib(gw.child.id().unwrap_or(0));
    let stream_counts: &[usize] = if quick { &[100] } else { &[1_000, 10_000] };
    let mut mem = Vec::new();
    for &n in stream_counts {
        let rss = rss_with_streams(&gw, n).await;
        println!(
            "{n} open streams: gateway RSS {:.1} MiB (idle {:.1} MiB)",
            rss as f64 / 1024.0,
            idle_rss as f64 / 1024.0
        );
        mem.push((n, rss));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    if write && !quick {
        let mut md = String::new();
        md.push_str("# Gateway overhead\n\nCommand: `cargo bench --bench overhead`  \n");
        md.push_str(&format!(
            "Machine: {} cores (shared, noisy); load generator, upstream and kvgate on the same machine. One run; medians and ratios from that run.  \n",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        ));
        md.push_str("Upstream: a minimal OpenAI-shaped server answering at once, so the difference between the two paths is kvgate alone (parse, canonical window, key, placement, proxying over HTTP/1.1 keep-alive).\n\n");
        md.push_str("| rate (req/s) | direct p50 | direct p99 | via kvgate p50 | via kvgate p99 | **added p50** | **added p99** | achieved | sustained |\n|---|---|---|---|---|---|---|---|---|\n");
        for (rate, d, v, s) in &rows {
            md.push_str(&format!(
                "| {rate} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | **{:.3} ms** | **{:.3} ms** | {:.0}/s | {} |\n",
                d.p50_ms, d.p99_ms, v.p50_ms, v.p99_ms, v.p50_ms - d.p50_ms, v.p99_ms - d.p99_ms, v.achieved, if *s { "yes" } else { "no" }
            ));
        }
        md.push_str(&format!(
            "\nClosed loop, 64 concurrent clients for {sat_secs} s: direct {sat_direct:.0} req/s, through kvgate {sat_via:.0} req/s ({:.0}% of direct).\n\n",
            100.0 * sat_via / sat_direct
        ));
        md.push_str(&format!(
            "Memory (gateway process RSS): idle {:.1} MiB",
            idle_rss as f64 / 1024.0
        ));
        for (n, rss) in &mem {
            md.push_str(&format!(
                "; {n} open streams {:.1} MiB",
                *rss as f64 / 1024.0
            ));
        }
        md.push_str(".\nStreams are opened over HTTP/2 (100 per connection, as an ingress multiplexes them) because this sandbox caps open files at 20,000 and the gateway holds one upstream socket per stream.\n");
        let out = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results/overhead.md");
        std::fs::create_dir_all(std::path::Path::new(out).parent().unwrap()).unwrap();
        std::fs::write(out, md).unwrap();
        println!("wrote {out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
