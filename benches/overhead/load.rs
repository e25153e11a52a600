//! The load generator: a lean HTTP/1.1 client on hyper's connection API (no
//! pool, no URL parsing, so the generator takes little of the CPU the
//! proxies need), an open loop free of coordinated omission and a closed loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Requests still queued this long after their due time are counted as errors
/// and not sent, so an overloaded path ends its cell.
const GIVE_UP: Duration = Duration::from_secs(5);

/// One keep-alive connection to a target, reopened after an error.
pub struct Conn {
    addr: SocketAddr,
    host: String,
    tx: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Self {
        Conn {
            addr,
            host: addr.to_string(),
            tx: None,
        }
    }

    async fn open(&self) -> Option<SendRequest<Full<Bytes>>> {
        let s = TcpStream::connect(self.addr).await.ok()?;
        s.set_nodelay(true).ok()?;
        let (tx, conn) = http1::handshake(TokioIo::new(s)).await.ok()?;
        tokio::spawn(conn);
        Some(tx)
    }

    /// POSTs `body` to /v1/chat/completions; true on a 200 read to its end.
    pub async fn post(&mut self, body: &Bytes) -> bool {
        let mut tx = match self.tx.take() {
            Some(tx) if !tx.is_closed() => tx,
            _ => match self.open().await {
                Some(tx) => tx,
                None => return false,
            },
        };
        if tx.ready().await.is_err() {
            return false;
        }
        let req = http::Request::post("/v1/chat/completions")
            .header(http::header::HOST, &self.host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        let ok = match tx.send_request(req).await {
            Ok(r) => r.status() == http::StatusCode::OK && r.into_body().collect().await.is_ok(),
            Err(_) => false,
        };
        if ok {
            self.tx = Some(tx);
        }
        ok
    }
}

/// Asks for 1 µs of timer slack on this thread instead of Linux's 50 µs, so
/// its sleeps end on time; fine if refused. (`/proc/TID/timerslack_ns` is the
/// thread's own; a thread may set its own without privileges.)
fn tighten_timer_slack() {
    let tid = std::fs::read_link("/proc/thread-self").ok();
    if let Some(tid) = tid.as_ref().and_then(|p| p.file_name()) {
        let path = std::path::Path::new("/proc")
            .join(tid)
            .join("timerslack_ns");
        std::fs::write(path, "1000").ok();
    }
}

/// What one open-loop cell measured.
pub struct Open {
    /// Latencies from each request's due time, µs, sorted.
    pub lat_us: Vec<f64>,
    pub errors: usize,
    /// Completed requests a second, over first due time to last answer.
    pub achieved: f64,
}

/// Open loop at `rate` for `secs` over `conns` (given back filled): request i
/// is due at start + i/rate whatever happened before it, and its latency runs
/// from that due time, so a stall counts against every request it delays.
/// A dedicated thread keeps the schedule (tokio's timer ticks in whole
/// milliseconds, 5–10 requests at these rates); idle connections take the
/// due requests in turn.
pub async fn open_loop(conns: &mut Vec<Conn>, body: &Bytes, rate: f64, secs: f64) -> Open {
    let n = (rate * secs) as usize;
    let start = Instant::now() + Duration::from_millis(5);
    let (due_tx, due_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let pacer = std::thread::spawn(move || {
        tighten_timer_slack();
        for i in 0..n {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if due_tx.send(due).is_err() {
                return;
            }
        }
    });
    let due_rx = Arc::new(tokio::sync::Mutex::new(due_rx));
    let workers: Vec<_> = std::mem::take(conns)
        .into_iter()
        .map(|mut c| {
            let (rx, body) = (Arc::clone(&due_rx), body.clone());
            tokio::spawn(async move {
                let (mut lat, mut errors, mut last) = (Vec::new(), 0, start);
                loop {
                    let due = rx.lock().await.recv().await;
                    let Some(due) = due else { break };
                    if due.elapsed() > GIVE_UP {
                        errors += 1;
                        continue;
                    }
                    if c.post(&body).await {
                        last = Instant::now();
                        lat.push((last - due).as_secs_f64() * 1e6);
                    } else {
                        errors += 1;
                    }
                }
                (c, lat, errors, last)
            })
        })
        .collect();
    let (mut lat_us, mut errors, mut last) = (Vec::with_capacity(n), 0, start);
    for w in workers {
        let (c, l, e, t) = w.await.unwrap();
        conns.push(c);
        lat_us.extend(l);
        errors += e;
        last = last.max(t);
    }
    pacer.join().unwrap();
    lat_us.sort_by(f64::total_cmp);
    let wall = (last - start).as_secs_f64().max(1e-9);
    Open {
        achieved: lat_us.len() as f64 / wall,
        lat_us,
        errors,
    }
}

/// Closed loop: `conc` connections each sending back to back. After `warm`
/// seconds `sample` is read, then again `secs` later; returns requests a
/// second in that window, the requests, and the two samples.
pub async fn closed_loop<T>(
    addr: SocketAddr,
    body: &Bytes,
    conc: usize,
    (warm, secs): (f64, f64),
    sample: impl Fn() -> T,
) -> (f64, u64, T, T) {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..conc)
        .map(|_| {
            let (done, stop, body) = (Arc::clone(&done), Arc::clone(&stop), body.clone());
            tokio::spawn(async move {
                let mut c = Conn::new(addr);
                while !stop.load(Ordering::Relaxed) {
                    if c.post(&body).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(warm)).await;
    let (n0, s0, t0) = (done.load(Ordering::Relaxed), sample(), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let (n1, s1, t1) = (done.load(Ordering::Relaxed), sample(), Instant::now());
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let n = n1 - n0;
    (n as f64 / (t1 - t0).as_secs_f64(), n, s0, s1)
}
