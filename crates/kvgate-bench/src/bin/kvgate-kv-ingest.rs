//! `kvgate-kv-ingest`: the gateway's CPU and memory a KV-event block, measured
//! from outside. A child process publishes prebuilt vLLM-format batches over
//! real ZeroMQ PUB sockets, one per engine, at a set rate; this process
//! follows them with kvgate's own subscriber (`kvgate::kv_events`) on one
//! tokio worker thread, and divides its CPU time (its threads' `schedstat`) by the
//! blocks applied (stored or removed) and its resident memory growth by the
//! blocks held.
//!
//! Each batch is one `BlockStored` of 16 blocks of 16 tokens (token ids
//! included; chained 8 batches to a prompt) and, once `--held-batches` are
//! held, one `BlockRemoved` of the 16 oldest: an engine at a steady state.
//! With `--distinct` every engine stores its own token ids; without, every
//! engine stores the same ones (a prefix every engine holds). `--steps N`
//! puts N such batches' events in each message, as a busy vLLM engine does
//! (one message an engine step, every event of the step in it), to tell
//! what a message costs from what a block does.

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use kvgate::kv_events::feed::FeedSettings;
use kvgate::kv_events::{Feed, Subscription, Trust};
use rmp::encode::{write_array_len, write_f64, write_map_len, write_nil, write_str, write_uint};
use zeromq::{Socket, SocketSend, ZmqMessage};

/// The gateway's own allocator (`src/main.rs`): the memory a held block
/// costs is what the shipped binary's allocator keeps for it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Encoding {
    /// Current vLLM: maps with a `type` member.
    Map,
    /// vLLM ≤ 0.10: msgspec tagged arrays.
    Array,
}

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Engines (one PUB socket each).
    #[arg(long, default_value_t = 16)]
    publishers: usize,
    /// Blocks a second offered, all engines together (stored + removed).
    #[arg(long, default_value_t = 1_000_000)]
    rate: u64,
    /// How long to publish.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, value_enum, default_value = "map")]
    encoding: Encoding,
    /// Batches each engine holds before it evicts (16 blocks each).
    #[arg(long, default_value_t = 32)]
    held_batches: usize,
    /// Each engine stores its own blocks (otherwise all store the same).
    #[arg(long)]
    distinct: bool,
    /// Only fill: publish `held_batches` batches an engine, no removals, and
    /// report memory.
    #[arg(long)]
    fill: bool,
    /// Also time routing's look at every instance (trust, match of a
    /// 128-block prompt, held blocks), once a millisecond on another thread:
    /// idle for a second before publishing, then while the events pour in.
    #[arg(long)]
    decisions: bool,
    /// Engine steps a message: each message carries this many batches'
    /// events (vLLM publishes one message per engine step, with every event
    /// of the step in it). Must divide `--held-batches`.
    #[arg(long, default_value_t = 1)]
    steps: usize,
    /// Internal: run as the publishing child.
    #[arg(long, hide = true)]
    child: bool,
}

const BLOCK: usize = 16;
const BLOCKS_A_BATCH: usize = 16;
const PROMPT_BATCHES: usize = 8;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Engine hash of block `j` of payload `p` for engine seed `e`.
fn hash(e: u64, p: usize, j: usize) -> u64 {
    mix(e ^ ((p * BLOCKS_A_BATCH + j) as u64 + 1))
}

fn hashes(out: &mut Vec<u8>, e: u64, p: usize) -> std::io::Result<()> {
    write_array_len(out, BLOCKS_A_BATCH as u32)?;
    for j in 0..BLOCKS_A_BATCH {
        write_uint(out, hash(e, p, j))?;
    }
    Ok(())
}

/// The token ids payload `p` of engine seed `e` stores.
fn tokens(e: u64, p: usize) -> Vec<u64> {
    (0..BLOCKS_A_BATCH * BLOCK)
        .map(|t| mix(e ^ ((p * 4096 + t) as u64) ^ 0x5eed) % 150_000)
        .collect()
}

/// Routing's look at every instance, as `Endpoint::view` takes it; its time.
fn decision(feeds: &[Arc<Feed>], keys: &[u64]) -> Duration {
    let w = kvgate_routing::held::TierWeights { cpu: 0.8, l2: 0.5 };
    let t = Instant::now();
    let mut n = 0usize;
    let mut live = Vec::with_capacity(feeds.len());
    for f in feeds {
        if f.trust(t).is_live() {
            f.expire_due(t);
            live.extend(f.slot());
            n += f.held_blocks();
        }
    }
    // One walk of the prompt for the whole fleet, as `Endpoint::view` does.
    if let Some(f) = feeds.first() {
        let held = f.fleet().matched_all(keys, None, w);
        n += live
            .iter()
            .filter_map(|&s| held.get(s as usize))
            .map(|h| h.blocks)
            .sum::<usize>();
    }
    std::hint::black_box(n);
    t.elapsed()
}

/// Decisions once a millisecond until `stop`; their times.
fn sample(
    feeds: &[Arc<Feed>],
    keys: &[u64],
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<Duration> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        out.push(decision(feeds, keys));
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |q: f64| {
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    format!(
        "{} decisions P50 {:.1} µs P99 {:.1} µs",
        v.len(),
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6
    )
}

/// The payloads an engine cycles through: `2 × held` batches, payload `p`
/// storing its 16 blocks and removing those of payload `p − held`, `--steps`
/// of them a message.
fn payloads(a: &Args, engine: usize) -> anyhow::Result<Vec<Vec<u8>>> {
    let events = events(a, engine)?;
    let steps = a.steps;
    events
        .chunks(steps)
        .map(|step| {
            let mut out = Vec::with_capacity(2048 * steps);
            write_array_len(&mut out, 2)?;
            write_f64(&mut out, 1.7e9)?;
            write_array_len(&mut out, step.iter().map(Vec::len).sum::<usize>() as u32)?;
            for e in step.iter().flatten() {
                out.extend_from_slice(e);
            }
            Ok(out)
        })
        .collect()
}

/// Each batch's events, encoded: its `BlockStored` and, but when filling,
/// its `BlockRemoved`.
fn events(a: &Args, engine: usize) -> anyhow::Result<Vec<Vec<Vec<u8>>>> {
    let e = if a.distinct {
        mix(engine as u64 + 7)
    } else {
        0
    };
    let cycle = if a.fill {
        a.held_batches
    } else {
        2 * a.held_batches
    };
    let mut all = Vec::with_capacity(cycle);
    for p in 0..cycle {
        let mut out = Vec::with_capacity(2048);
        let remove = !a.fill;
        let parent = (p % PROMPT_BATCHES != 0).then(|| hash(e, p - 1, BLOCKS_A_BATCH - 1));
        let tokens = tokens(e, p);
        match a.encoding {
            Encoding::Array => {
                write_array_len(&mut out, 7)?;
                write_str(&mut out, "BlockStored")?;
                hashes(&mut out, e, p)?;
            }
            Encoding::Map => {
                write_map_len(&mut out, 7)?;
                write_str(&mut out, "type")?;
                write_str(&mut out, "BlockStored")?;
                write_str(&mut out, "block_hashes")?;
                hashes(&mut out, e, p)?;
                write_str(&mut out, "parent_block_hash")?;
            }
        }
        match parent {
            Some(h) => write_uint(&mut out, h).map(|_| ())?,
            None => write_nil(&mut out)?,
        }
        if a.encoding == Encoding::Map {
            write_str(&mut out, "token_ids")?;
        }
        write_array_len(&mut out, tokens.len() as u32)?;
        for t in &tokens {
            write_uint(&mut out, *t)?;
        }
        if a.encoding == Encoding::Map {
            write_str(&mut out, "block_size")?;
        }
        write_uint(&mut out, BLOCK as u64)?;
        if a.encoding == Encoding::Map {
            write_str(&mut out, "lora_id")?;
        }
        write_nil(&mut out)?;
        if a.encoding == Encoding::Map {
            write_str(&mut out, "medium")?;
        }
        write_str(&mut out, "GPU")?;
        let mut events = vec![out];
        if remove {
            let mut out = Vec::with_capacity(256);
            let gone = (p + cycle - a.held_batches) % cycle;
            match a.encoding {
                Encoding::Array => {
                    write_array_len(&mut out, 3)?;
                    write_str(&mut out, "BlockRemoved")?;
                    hashes(&mut out, e, gone)?;
                }
                Encoding::Map => {
                    write_map_len(&mut out, 3)?;
                    write_str(&mut out, "type")?;
                    write_str(&mut out, "BlockRemoved")?;
                    write_str(&mut out, "block_hashes")?;
                    hashes(&mut out, e, gone)?;
                    write_str(&mut out, "medium")?;
                }
            }
            write_str(&mut out, "GPU")?;
            events.push(out);
        }
        all.push(events);
    }
    Ok(all)
}

/// The child: bind, print the addresses, wait for `go`, publish, print `sent`.
async fn publish(a: Args) -> anyhow::Result<()> {
    let mut socks = Vec::with_capacity(a.publishers);
    let mut urls = Vec::with_capacity(a.publishers);
    for _ in 0..a.publishers {
        let mut s = zeromq::PubSocket::new();
        urls.push(s.bind("tcp://127.0.0.1:0").await?.to_string());
        socks.push(s);
    }
    let shared = if a.distinct {
        None
    } else {
        Some(payloads(&a, 0)?)
    };
    let mut own = Vec::new();
    if a.distinct {
        for i in 0..a.publishers {
            own.push(payloads(&a, i)?);
        }
    }
    // Prebuilt before the clock starts; engines that store the same blocks
    // share one set of frames.
    let sets: Vec<Vec<bytes::Bytes>> = shared
        .iter()
        .chain(own.iter())
        .map(|set| {
            set.iter()
                .map(|p| bytes::Bytes::copy_from_slice(p))
                .collect()
        })
        .collect();
    let frames = |i: usize| &sets[if a.distinct { i } else { 0 }];
    let cycle = sets[0].len();
    println!("{}", urls.join(" "));
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let per_batch = a.steps as f64
        * if a.fill {
            BLOCKS_A_BATCH
        } else {
            2 * BLOCKS_A_BATCH
        } as f64;
    let round = Duration::from_secs_f64(a.publishers as f64 * per_batch / a.rate as f64);
    let rounds = if a.fill {
        cycle
    } else {
        (a.seconds / round.as_secs_f64()).ceil() as usize
    };
    let start = tokio::time::Instant::now();
    let mut sent = 0u64;
    for r in 0..rounds {
        tokio::time::sleep_until(start + round * r as u32).await;
        for (i, s) in socks.iter_mut().enumerate() {
            let mut m = ZmqMessage::from(bytes::Bytes::new());
            m.push_back(bytes::Bytes::copy_from_slice(&(r as u64).to_be_bytes()));
            m.push_back(frames(i)[r % cycle].clone());
            s.send(m).await?;
            sent += 1;
        }
    }
    println!("sent {sent} {:.3}", start.elapsed().as_secs_f64());
    // Keep the sockets open until the parent has read everything.
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(())
}

/// CPU seconds of this process's threads so far (each thread's
/// `schedstat`: nanoseconds on a CPU).
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

struct Totals {
    batches: u64,
    applied: u64,
    gaps: u64,
    shed: u64,
    held: u64,
}

fn totals(feeds: &[Arc<Feed>]) -> Totals {
    let mut t = Totals {
        batches: 0,
        applied: 0,
        gaps: 0,
        shed: 0,
        held: 0,
    };
    for f in feeds {
        let c = &f.counters;
        t.batches += c.batches.load(Ordering::Relaxed);
        t.applied += c.applied.load(Ordering::Relaxed);
        t.gaps += c.gaps.load(Ordering::Relaxed);
        t.shed += c.shed.load(Ordering::Relaxed);
        t.held += f.held_blocks() as u64;
    }
    t
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if a.steps == 0 || a.held_batches % a.steps != 0 {
        bail!("--steps must divide --held-batches");
    }
    if a.child {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        return rt.block_on(publish(a));
    }
    let mut child = Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .arg("--child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut to_child = child.stdin.take().context("child stdin")?;
    let mut from_child = std::io::BufReader::new(child.stdout.take().context("child stdout")?);
    let mut line = String::new();
    from_child.read_line(&mut line)?;
    let urls: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    if urls.len() != a.publishers {
        bail!("the child bound {} sockets", urls.len());
    }
    // One worker thread: the gateway's ingestion on one core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let settings = FeedSettings {
        silence: Duration::from_secs(60),
        limit: 1 << 20,
        block_size: BLOCK,
    };
    let rss_empty = rss_bytes();
    let fleet = Arc::new(kvgate_routing::held::fleet::FleetHeld::new());
    let subs: Vec<Subscription> = rt.block_on(async {
        urls.iter()
            .enumerate()
            .filter_map(|(i, u)| {
                Subscription::start(Feed::new(
                    ("bench", &format!("e{i}")),
                    u,
                    None,
                    settings,
                    &fleet,
                ))
            })
            .collect()
    });
    let feeds: Vec<Arc<Feed>> = subs.iter().map(|s| Arc::clone(&s.feed)).collect();
    let ready = Instant::now();
    while feeds.iter().any(|f| {
        matches!(
            f.trust(Instant::now()),
            Trust::Disconnected | Trust::Replaying
        )
    }) {
        if ready.elapsed() > Duration::from_secs(60) {
            bail!("publishers not reached in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Subscriptions travel to the publishers after the connection.
    std::thread::sleep(Duration::from_millis(500));
    // A prompt of engine 0's first 8 payloads (one chain of 128 blocks).
    let e0 = if a.distinct { mix(7) } else { 0 };
    let prompt: Vec<u32> = (0..PROMPT_BATCHES)
        .flat_map(|p| tokens(e0, p))
        .map(|t| t as u32)
        .collect();
    let keys =
        kvgate_routing::held::token_keys(kvgate_routing::held::seed(None), &prompt, BLOCK, 128);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let idle = if a.decisions {
        let (f, k, s) = (feeds.clone(), keys.clone(), Arc::clone(&stop));
        let h = std::thread::spawn(move || sample(&f, &k, &s));
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        Some(percentiles(h.join().unwrap_or_default()))
    } else {
        None
    };
    stop.store(false, Ordering::Relaxed);
    let busy = a.decisions.then(|| {
        let (f, k, s) = (feeds.clone(), keys.clone(), Arc::clone(&stop));
        std::thread::spawn(move || sample(&f, &k, &s))
    });
    let (cpu0, rss0, t0) = (cpu_seconds(), rss_bytes(), totals(&feeds));
    writeln!(to_child, "go")?;
    line.clear();
    from_child.read_line(&mut line)?;
    let sent: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // Wait until everything sent was read (or nothing moves for 2 s).
    let mut last = (totals(&feeds).batches, Instant::now());
    loop {
        let t = totals(&feeds);
        if t.batches + t.shed >= t0.batches + sent {
            break;
        }
        if t.batches != last.0 {
            last = (t.batches, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall = t0_wall(&line);
    stop.store(true, Ordering::Relaxed);
    let busy = busy.map(|h| percentiles(h.join().unwrap_or_default()));
    let (cpu1, rss1, t1) = (cpu_seconds(), rss_bytes(), totals(&feeds));
    let applied = t1.applied - t0.applied;
    let cpu = cpu1 - cpu0;
    println!(
        "publishers {} encoding {:?} distinct {} steps a message {} offered {} blocks/s: batches sent {sent} read {} gaps {} shed {}; blocks applied {applied} in {wall:.2} s ({:.2} M/s); gateway CPU {cpu:.2} s = {:.3} µs a block applied; held {} blocks, RSS {:.1} MiB (+{:.1} MiB since subscribing, {:.1} MiB since start) = {:.1} B a held block over the empty subscribers, {:.1} B over the process before subscribing",
        a.publishers,
        a.encoding,
        a.distinct,
        a.steps,
        a.rate,
        t1.batches - t0.batches,
        t1.gaps - t0.gaps,
        t1.shed - t0.shed,
        applied as f64 / wall.max(1e-9) / 1e6,
        cpu * 1e6 / applied.max(1) as f64,
        t1.held,
        rss1 as f64 / 1048576.0,
        (rss1.saturating_sub(rss0)) as f64 / 1048576.0,
        (rss1.saturating_sub(rss_empty)) as f64 / 1048576.0,
        rss1.saturating_sub(rss0) as f64 / t1.held.max(1) as f64,
        rss1.saturating_sub(rss_empty) as f64 / t1.held.max(1) as f64,
    );
    if let (Some(idle), Some(busy)) = (idle, busy) {
        println!(
            "routing's look at {} instances: idle {idle}; under ingestion {busy} (the sampler's own CPU included above)",
            a.publishers
        );
    }
    writeln!(to_child, "done")?;
    let _ = child.wait();
    drop(subs);
    Ok(())
}

/// The child's publishing time, from its `sent N SECONDS` line.
fn t0_wall(line: &str) -> f64 {
    line.split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0)
}
