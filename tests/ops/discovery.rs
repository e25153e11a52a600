//! DNS discovery against a real DNS server on loopback (Debian's dnsmasq):
//! instances join and leave as its answers change, with traffic flowing and
//! nothing failing; an empty answer or a dead server keeps the last set.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};

use super::*;

const NAME: &str = "vllm-headless.serving.svc.cluster.local";

/// dnsmasq answering only from a hosts file, re-read on SIGHUP.
struct Dns {
    child: Child,
    port: u16,
    hosts: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Dns {
    /// Start dnsmasq and wait until it answers for `NAME`. A start that
    /// dies (its port taken meanwhile, say) is retried on another port; a
    /// server that never answers fails the test with dnsmasq's own log.
    async fn start(ips: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("kvgate-dns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hosts = dir.join("hosts");
        let log = dir.join("dnsmasq.log");
        write_hosts(&hosts, ips);
        let want: Vec<SocketAddr> = ips
            .iter()
            .map(|&i| SocketAddr::from((Ipv4Addr::new(127, 0, 0, i), 1)))
            .collect();
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_udp_and_tcp_port();
            let mut dns = Self {
                child: spawn_dnsmasq(port, &hosts, &log),
                port,
                hosts: hosts.clone(),
                log: log.clone(),
            };
            let resolver = kvgate::fleet::discovery::dns::resolver(Some(SocketAddr::from((
                [127, 0, 0, 1],
                port,
            ))))
            .unwrap();
            for _ in 0..100 {
                if let Ok(Some(status)) = dns.child.try_wait() {
                    last = format!("dnsmasq exited ({status})");
                    break;
                }
                match kvgate::fleet::discovery::dns::lookup(&resolver, NAME, 1).await {
                    Ok(got) if got == want => return dns,
                    Ok(got) => last = format!("answered {got:?}"),
                    Err(e) => last = e,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            last = format!("{last}; its log:\n{}", dns.log());
            drop(dns);
        }
        panic!("dnsmasq never answered for {NAME}: {last}");
    }

    /// Answer from now on with these addresses. SIGHUP makes dnsmasq re-read
    /// the file (sent only once it runs: before, SIGHUP would end it).
    fn answer(&self, ips: &[u8]) {
        write_hosts(&self.hosts, ips);
        let _ = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status();
    }

    /// What dnsmasq printed, for a failure message.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `--no-daemon` rather than `--keep-in-foreground`: it never changes user
/// or group, so it runs the same as root, as another user, or where a
/// sandbox refuses those calls; it logs to stderr, which goes to `log`.
fn spawn_dnsmasq(port: u16, hosts: &std::path::Path, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(dnsmasq())
        .args([
            "--no-daemon",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            // Authoritative for the cluster's domain, as CoreDNS is: an
            // AAAA query for an IPv4-only name is an empty NOERROR, not a
            // REFUSED that the resolver retries over TCP.
            "--local=/cluster.local/",
            "--bind-interfaces",
            "--listen-address=127.0.0.1",
            "--pid-file=",
            "--local-ttl=0",
            "--log-facility=-",
            "--log-queries",
            &format!("--port={port}"),
            &format!("--addn-hosts={}", hosts.display()),
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("dnsmasq (apt-get install dnsmasq; .ci/run installs it)")
}

/// A port free on 127.0.0.1 for both UDP and TCP (dnsmasq takes both).
fn free_udp_and_tcp_port() -> u16 {
    loop {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Debian puts it in /usr/sbin, which a non-root PATH may lack.
fn dnsmasq() -> &'static str {
    if std::path::Path::new("/usr/sbin/dnsmasq").exists() {
        "/usr/sbin/dnsmasq"
    } else {
        "dnsmasq"
    }
}

/// `NAME` is 127.0.0.<ip> for each of `ips` (none: NXDOMAIN).
fn write_hosts(path: &std::path::Path, ips: &[u8]) {
    let text: String = ips
        .iter()
        .map(|i| format!("127.0.0.{i} {NAME}\n"))
        .collect();
    std::fs::write(path, text).unwrap();
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Upstreams on 127.0.0.<ip>:port, one port for all (DNS gives addresses, not ports).
pub async fn fleet(ips: &[u8]) -> (u16, Vec<Upstream>) {
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut ups = Vec::new();
        for &i in ips {
            let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, i), port));
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => ups.push(Upstream::start_on(l, &format!("u{i}"), Mode::Json).await),
                Err(_) => break,
            }
        }
        if ups.len() == ips.len() {
            return (port, ups);
        }
    }
    panic!("no port free on every loopback address");
}

/// Chat requests sent one after another until stopped, each with a new
/// prompt, counting those that were not a 200.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicUsize>,
    sent: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    pub fn start(gw: &Arc<Gateway>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicUsize::new(0));
        let (g, st, f, se) = (gw.clone(), stop.clone(), failed.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let mut n = 0;
            while !st.load(Ordering::SeqCst) {
                n += 1;
                let resp = g
                    .chat(&chat_body(MODEL, &system_prompt(n), "q", false))
                    .await;
                if resp.status() != 200 {
                    f.fetch_add(1, Ordering::SeqCst);
                }
                se.fetch_add(1, Ordering::SeqCst);
            }
        });
        Self {
            stop,
            failed,
            sent,
            task,
        }
    }

    /// Wait until 20 more requests have been answered.
    pub async fn flows(&self, what: &str) {
        let before = self.sent.load(Ordering::SeqCst);
        eventually(what, || self.sent.load(Ordering::SeqCst) > before + 20).await;
    }

    /// Stop and say how many requests failed.
    pub async fn failed(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        self.failed.load(Ordering::SeqCst)
    }
}

pub fn ids(gw: &Gateway) -> Vec<String> {
    let mut ids: Vec<String> = gw.instances().iter().map(|i| i.id.clone()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_join_and_leave_as_dns_answers_change() {
    let (port, ups) = fleet(&[2, 3, 4]).await;
    let dns = Dns::start(&[2, 3]).await;
    let yaml = format!(
        r#"server:
  listen: "127.0.0.1:0"
  failover_cooldown_ms: 60000
endpoints:
  - name: chat
    models: ["{MODEL}"]
    discovery:
      dns: "{NAME}:{port}"
      dns_server: "127.0.0.1:{}"
      interval_ms: 100
    routing:
      strategy: prefix_aware
      prefix_length: 1024
      concurrency_threshold: 64
"#,
        dns.port
    );
    let gw = Arc::new(Gateway::start(&yaml).await);
    let at = |i: u8| format!("127.0.0.{i}:{port}");
    let discovered = || ids(&gw) == [at(2), at(3)];
    for _ in 0..300 {
        if discovered() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        discovered(),
        "two instances discovered: the gateway has {:?}; dnsmasq's log:\n{}",
        ids(&gw),
        dns.log()
    );

    // Traffic throughout: every request must succeed while the set changes.
    let traffic = Traffic::start(&gw);
    traffic.flows("traffic flowing").await;

    // A pod joins and another leaves.
    dns.answer(&[3, 4]);
    eventually("the set follows the answer", || ids(&gw) == [at(3), at(4)]).await;
    traffic.flows("traffic after the change").await;
    assert!(ups[2].hits() > 0, "the joined instance takes traffic");

    // An empty answer (NXDOMAIN) keeps the last known set, and is counted.
    dns.answer(&[]);
    let metrics_has_failure = || async {
        gw.metrics().await.lines().any(|l| {
            l.starts_with("kvgate_discovery_failures_total{") && l.contains("endpoint=\"chat\"")
        })
    };
    for _ in 0..100 {
        if metrics_has_failure().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(metrics_has_failure().await, "a failed lookup is counted");
    assert_eq!(
        ids(&gw),
        [at(3), at(4)],
        "a failed lookup keeps the last set"
    );

    // The DNS server dies: still serving on the last set.
    drop(dns);
    traffic.flows("traffic with DNS gone").await;
    assert_eq!(ids(&gw), [at(3), at(4)]);

    assert_eq!(
        traffic.failed().await,
        0,
        "requests failed while instances changed"
    );
}

#[test]
fn discovery_mistakes_name_their_field() {
    let base = |d: &str| {
        format!("endpoints:\n  - name: chat\n    models: [m]\n    discovery: {{ {d} }}\n")
    };
    for (d, field) in [
        ("dns_server: \"127.0.0.1\"", "endpoints[0].discovery.dns"),
        ("dns: \"vllm\"", "endpoints[0].discovery.dns"),
        ("dns: \"vllm:0\"", "endpoints[0].discovery.dns"),
        (
            "dns: \"vllm:8000\", dns_server: \"dns.local\"",
            "endpoints[0].discovery.dns_server",
        ),
        (
            "dns: \"vllm:8000\", interval_ms: 10",
            "endpoints[0].discovery.interval_ms",
        ),
        (
            "dns: \"vllm:8000\", scheme: ftp",
            "endpoints[0].discovery.scheme",
        ),
        (
            "kubernetes: { service: vllm, port: 8000 }",
            "endpoints[0].discovery.kubernetes.namespace",
        ),
        (
            "kubernetes: { namespace: Serving, service: vllm, port: 8000 }",
            "endpoints[0].discovery.kubernetes.namespace",
        ),
        (
            "kubernetes: { namespace: serving, port: 8000 }",
            "endpoints[0].discovery.kubernetes.service",
        ),
        (
            "kubernetes: { namespace: serving, service: vllm }",
            "endpoints[0].discovery.kubernetes.port",
        ),
        (
            "kubernetes: { namespace: serving, service: vllm, port: 0 }",
            "endpoints[0].discovery.kubernetes.port",
        ),
        (
            "kubernetes: { namespace: s, service: v, port: 1 }, dns: \"v:1\"",
            "endpoints[0].discovery.kubernetes",
        ),
        (
            "kubernetes: { namespace: s, service: v, port: 1 }, dns_server: \"1.1.1.1\"",
            "endpoints[0].discovery.dns_server",
        ),
    ] {
        let err = kvgate::Config::from_yaml(&base(d)).unwrap_err();
        assert_eq!(err.field, field, "{d}: {err}");
    }
    let ok = kvgate::Config::from_yaml(&base("dns: \"vllm:8000\"")).unwrap();
    assert!(ok.endpoints[0].instances.is_empty());
}

/// Before any answer (a resolver that never replies) the endpoint has no
/// instance: a 503 in the OpenAI shape, and the gateway keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_with_nothing_discovered_yet_answers_503() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let yaml = format!(
        "endpoints:\n  - name: chat\n    models: [\"{MODEL}\"]\n    discovery: {{ dns: \"{NAME}:8000\", dns_server: \"{}\" }}\n",
        silent.local_addr().unwrap()
    );
    let gw = Gateway::start(&yaml).await;
    let resp = gw.chat(&chat_body(MODEL, "s", "q", false)).await;
    assert_eq!(resp.status(), 503);
    let body = resp.json_value().await;
    assert!(body["error"]["message"].is_string(), "{body}");
    let health = client().get(gw.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}
