//! Several `kvgate serve` processes sharing tenant limits through one real
//! `redis-server` (`cluster.redis`): each limit holds across the replicas;
//! with Redis killed they keep serving on their local shares, and take up
//! the shared limits again when it is back; a dead replica's concurrency
//! slots expire. Needs Debian's `redis-server` on the PATH (`.ci/run`
//! installs it).

use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::*;

/// A `redis-server` on a loopback port, without persistence.
pub(super) struct Redis {
    port: u16,
    child: Child,
}

impl Redis {
    pub(super) async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_on(port).await
    }

    pub(super) async fn start_on(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is not installed (apt-get install -y redis-server)");
        for _ in 0..200 {
            if ping(port).await {
                return Self { port, child };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis-server did not answer PING on port {port}");
    }

    pub(super) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub(super) async fn kill(mut self) -> u16 {
        self.child.kill().await.unwrap();
        self.port
    }
}

async fn ping(port: u16) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").await.is_ok()
        && s.read_exact(&mut buf).await.is_ok()
        && &buf == b"+PONG\r\n"
}

/// One `kvgate serve` process, its log kept line by line.
pub(super) struct Replica {
    addr: String,
    pub(super) child: Child,
    pub(super) log: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    pub(super) async fn start(yaml: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kvgate-cluster-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kvgate.yaml");
        std::fs::write(&path, yaml).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let addr = loop {
            let line = lines.next_line().await.unwrap().expect("kvgate exited");
            if let Some(rest) = line.split("addr=").nth(1) {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
            log.lock().unwrap().push(line);
        };
        // Keep reading, or a full pipe would stall the process.
        let keep = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep.lock().unwrap().push(line);
            }
        });
        Self { addr, child, log }
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn chat(&self, token: &str, question: &str) -> reqwest::Response {
        client()
            .post(self.url("/v1/chat/completions"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&small_chat(question)).unwrap())
            .send()
            .await
            .unwrap()
    }

    async fn metrics(&self) -> String {
        let resp = client().get(self.url("/metrics")).send().await.unwrap();
        resp.text().await.unwrap()
    }

    /// The value of a series without labels, or the first with them.
    pub(super) async fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.starts_with(series))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
    }

    /// Until Redis is up for this replica and counts `replicas` of them.
    pub(super) async fn sees(&self, replicas: usize) {
        let mut last = (None, None);
        for _ in 0..300 {
            let up = self.metric("kvgate_cluster_redis_up ").await;
            let n = self.metric("kvgate_cluster_replicas ").await;
            if up == Some(1.0) && n == Some(replicas as f64) {
                return;
            }
            last = (up, n);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "replica {} never saw Redis with {replicas} replicas: (up, replicas) = {last:?}\n{}",
            self.addr,
            self.log.lock().unwrap().join("\n")
        );
    }

    pub(super) fn logged(&self, needle: &str) -> usize {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).count()
    }
}

/// The tenancy config over `up` with these tenants, sharing limits through `redis`.
fn cluster_config(up: &Upstream, redis: &Redis, tenants: &str) -> String {
    jwt_config(
        &[up],
        &format!(
            "{tenants}cluster:\n  redis: \"{}\"\n  timeout_ms: 1000\n  heartbeat_ms: 200\n  slot_lease_ms: 1500\n",
            redis.url()
        ),
    )
}

async fn start_replicas(yaml: &str, n: usize) -> Vec<Replica> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Replica::start(yaml).await);
    }
    for r in &out {
        r.sees(n).await;
    }
    out
}

/// Send `n` requests of `token`'s tenant round-robin over `replicas`, one
/// after another; the statuses in order. A pause lets each answer's token
/// settlement reach Redis before the next request is charged.
async fn round_robin(replicas: &[&Replica], token: &str, n: usize, pause: Duration) -> Vec<u16> {
    let mut out = Vec::new();
    for i in 0..n {
        let resp = replicas[i % replicas.len()].chat(token, "q").await;
        out.push(resp.status().as_u16());
        resp.bytes().await.unwrap();
        tokio::time::sleep(pause).await;
    }
    out
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_tokens_per_minute_hold_across_three_replicas() {
    // Each answer reports 200 prompt + 300 completion tokens.
    const BODY: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":200,"completion_tokens":300,"total_tokens":500}}"#;
    let up = Upstream::start("u0", Mode::Raw(200, "application/json", BODY)).await;
    let redis = Redis::start().await;
    let yaml = cluster_config(
        &up,
        &redis,
        "tenants:\n  overrides:\n    acme: { requests_per_minute: 6 }\n    beta: { tokens_per_minute: 1000 }\n",
    );
    let rs = start_replicas(&yaml, 3).await;
    let all: Vec<&Replica> = rs.iter().collect();

    // Six requests a minute among three replicas, not six each.
    let acme = round_robin(&all, &hs256(&claims("acme")), 12, Duration::ZERO).await;
    assert_eq!(count(&acme, 200) + count(&acme, 429), 12, "{acme:?}");
    assert!((6..=7).contains(&count(&acme, 200)), "{acme:?}");
    assert!(acme[..6].iter().all(|&s| s == 200), "{acme:?}");

    // 1,000 tokens a minute at 500 a request: 1000 → 500 → 0, then refused
    // (prompt tokens alone would let five through; local limits six).
    let beta = round_robin(&all, &hs256(&claims("beta")), 9, Duration::from_millis(150)).await;
    assert_eq!(count(&beta, 200) + count(&beta, 429), 9, "{beta:?}");
    assert!((2..=3).contains(&count(&beta, 200)), "{beta:?}");
    assert!(beta[..2].iter().all(|&s| s == 200), "{beta:?}");
    assert_eq!(up.hits(), count(&acme, 200) + count(&beta, 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_holds_across_replicas_and_a_dead_replicas_slots_expire() {
    let up = Upstream::start("u0", Mode::Hold).await;
    let redis = Redis::start().await;
    let yaml = cluster_config(
        &up,
        &redis,
        "tenants:\n  overrides:\n    acme: { max_concurrency: 2 }\n",
    );
    let mut rs = start_replicas(&yaml, 2).await;
    let acme = hs256(&claims("acme"));
    let held: Vec<_> = rs
        .iter()
        .map(|r| {
            let req = client()
                .post(r.url("/v1/chat/completions"))
                .bearer_auth(&acme)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&small_chat("held")).unwrap())
                .send();
            tokio::spawn(req)
        })
        .collect();
    eventually("both held requests reached the upstream", || up.hits() == 2).await;
    // Past a lease: the heartbeat renews the live replicas' slots.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    for r in &rs {
        let resp = r.chat(&acme, "third").await;
        assert_eq!(resp.status(), 429, "a third slot across two replicas");
        assert_eq!(header(&resp, "x-ratelimit-limit-concurrency"), "2");
    }
    assert_eq!(up.hits(), 2, "a refused request was forwarded");
    // The first replica dies holding a slot; its lease runs out.
    rs[0].child.kill().await.unwrap();
    up.set_mode(Mode::Json);
    let survivor = &rs[1];
    let mut statuses = Vec::new();
    for _ in 0..200 {
        let s = survivor.chat(&acme, "after").await.status().as_u16();
        statuses.push(s);
        if s == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        statuses.last(),
        Some(&200),
        "the dead replica's slot never expired"
    );
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    // The survivor's own held request still counts: one slot, not two. (A
    // refusal here means the last answer's release had not reached Redis
    // yet: try again.)
    up.set_mode(Mode::Hold);
    let mut hold = None;
    for _ in 0..100 {
        let before = up.hits();
        let req = client()
            .post(survivor.url("/v1/chat/completions"))
            .bearer_auth(&acme)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&small_chat("second")).unwrap())
            .send();
        let task = tokio::spawn(req);
        while up.hits() == before && !task.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if up.hits() > before {
            hold = Some(task);
            break;
        }
    }
    let hold = hold.expect("a second slot was never granted");
    assert_eq!(survivor.chat(&acme, "over").await.status(), 429);
    hold.abort();
    for h in held {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_replicas_serve_on_their_shares_and_share_again_when_it_returns() {
    let up = Upstream::start("u0", Mode::Json).await;
    let redis = Redis::start().await;
    let yaml = cluster_config(
        &up,
        &redis,
        "tenants:\n  default: { requests_per_minute: 10 }\n",
    );
    let rs = start_replicas(&yaml, 2).await;
    let port = redis.kill().await;

    // Each of two replicas takes half of 10 a minute; nothing fails.
    let during = round_robin(&[&rs[0]], &hs256(&claims("during")), 8, Duration::ZERO).await;
    assert_eq!(during[..5], [200; 5], "{during:?}");
    assert_eq!(during[5..], [429; 3], "{during:?}");
    for r in &rs {
        let ready = client().get(r.url("/ready")).send().await.unwrap();
        assert_eq!(ready.status(), 200, "not ready without Redis");
    }
    // The second replica sent nothing: its heartbeat notices.
    for r in &rs {
        for _ in 0..200 {
            if r.metric("kvgate_cluster_redis_up ").await == Some(0.0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(r.metric("kvgate_cluster_redis_up ").await, Some(0.0));
    }
    let fallbacks = rs[0]
        .metric("kvgate_cluster_fallback_total{limit=\"rate\"}")
        .await;
    assert!(fallbacks.is_some_and(|n| n >= 8.0), "{fallbacks:?}");
    assert_eq!(
        rs[0].logged("Redis unreachable"),
        1,
        "logged once per outage"
    );

    // Redis is back: the replicas reconnect and the limit is shared again.
    let _redis = Redis::start_on(port).await;
    for r in &rs {
        r.sees(2).await;
    }
    let token = hs256(&claims("after"));
    let first = round_robin(&[&rs[0]], &token, 7, Duration::ZERO).await;
    assert_eq!(first, [200; 7], "a shared limit of 10, not a share of 5");
    let second = round_robin(&[&rs[1]], &token, 5, Duration::ZERO).await;
    assert!((3..=4).contains(&count(&second, 200)), "{second:?}");
    assert_eq!(count(&second, 200) + count(&second, 429), 5, "{second:?}");
    let log = rs[0].log.lock().unwrap().join("\n");
    assert_eq!(
        rs[0].logged("Redis reachable"),
        2,
        "up at start, and again:\n{log}"
    );
}
