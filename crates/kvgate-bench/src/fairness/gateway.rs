//! The gateway under test as its own process (`kvgate serve`, the release
//! binary beside this one), so that its CPU time is its own: utime + stime
//! of `/proc/PID/stat`, as `benches/overhead` reads it. Its YAML: one
//! endpoint over the simulated instances, the three tenants by API key,
//! and the `queue` section when the arm queues (absent otherwise: today's
//! pass-through). The queue's clocks (`max_wait_ms`, `engine_poll_ms`) are
//! real time, so they are written scaled by the simulation's `time_scale`:
//! the gateway waits and polls the same *simulated* time in every run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::tenants::TENANTS;

/// The `queue` section, in simulated time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueueKnobs {
    pub max_in_flight: usize,
    pub max_waiting: u64,
    pub max_kv_usage: f64,
    pub engine_poll: Duration,
    pub max_length: usize,
    pub max_wait: Duration,
    pub input_weight: f64,
    pub output_weight: f64,
}

/// The gateway's YAML: `endpoint` (also its model name) over `instances`,
/// listening on `port`, queueing when `queue` is given; `time_scale` turns
/// the queue's simulated durations into the real ones the gateway counts.
pub fn yaml(
    port: u16,
    endpoint: &str,
    instances: &[String],
    queue: Option<&QueueKnobs>,
    time_scale: f64,
) -> String {
    let mut s = format!(
        "server:\n  listen: \"127.0.0.1:{port}\"\n  max_body_bytes: 16777216\n  sse_keepalive_ms: 0\n  \
         timeouts:\n    first_byte_ms: 3600000\n    idle_ms: 3600000\n\
         endpoints:\n  - name: \"{endpoint}\"\n    models: [\"{endpoint}\"]\n    instances:\n"
    );
    for (i, url) in instances.iter().enumerate() {
        let _ = writeln!(s, "      - url: \"{url}\"\n        id: \"sim-{i}\"");
    }
    // Every prompt is unique: no prefix to follow, so the least loaded instance.
    s.push_str("    routing:\n      strategy: least_outstanding_requests\n");
    s.push_str("auth:\n  mode: api_key\n  api_keys:\n");
    for t in &TENANTS {
        let digest = hex::encode(Sha256::digest(t.key().as_bytes()));
        let _ = writeln!(s, "    - tenant: {}\n      sha256: \"{digest}\"", t.name);
    }
    s.push_str("isolation:\n  upstream_cache_salt: false\n");
    s.push_str("tenants:\n  default:\n    priority: normal\n    weight: 1\n  overrides:\n");
    for t in TENANTS.iter().filter(|t| t.priority != "normal") {
        let _ = writeln!(s, "    {}:\n      priority: {}", t.name, t.priority);
    }
    if let Some(q) = queue {
        let real_ms = |d: Duration| (d.as_secs_f64() * time_scale * 1e3).round().max(10.0);
        let _ = write!(
            s,
            "queue:\n  enabled: true\n  max_in_flight: {}\n  max_waiting: {}\n  max_kv_usage: {}\n  \
             engine_poll_ms: {}\n  max_length: {}\n  max_wait_ms: {}\n  input_weight: {}\n  \
             output_weight: {}\n",
            q.max_in_flight,
            q.max_waiting,
            q.max_kv_usage,
            real_ms(q.engine_poll),
            q.max_length,
            real_ms(q.max_wait),
            q.input_weight,
            q.output_weight,
        );
    }
    s
}

/// `kvgate` beside this executable (`target/release/kvgate` when this is
/// `target/release/kvgate-loadbench`).
pub fn default_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.join("kvgate");
    bin.is_file().then_some(bin)
}

/// A running `kvgate serve`, killed when dropped.
pub struct GatewayProc {
    child: Child,
    pub url: String,
    config: PathBuf,
    /// Its stderr (the gateway's log), kept for a failed start.
    pub log: PathBuf,
}

impl GatewayProc {
    /// Start `bin` with `yaml` (which must listen on `port`) and wait until
    /// `/health` answers (at most 20 s).
    pub async fn start(bin: &Path, yaml: &str, port: u16, name: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir();
        let stem = format!("kvgate-fairness-{}-{name}", std::process::id());
        let config = dir.join(format!("{stem}.yaml"));
        let log = dir.join(format!("{stem}.log"));
        std::fs::write(&config, yaml)?;
        let child = Command::new(bin)
            .args(["serve", "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", bin.display()))?;
        let mut g = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            config,
            log,
        };
        let client = reqwest::Client::builder().no_proxy().build()?;
        for _ in 0..2_000 {
            if let Ok(r) = client.get(format!("{}/health", g.url)).send().await
                && r.status().is_success()
            {
                return Ok(g);
            }
            if let Ok(Some(status)) = g.child.try_wait() {
                let log = std::fs::read_to_string(&g.log).unwrap_or_default();
                anyhow::bail!("the gateway exited at start ({status}):\n{log}\n{yaml}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        anyhow::bail!(
            "the gateway did not answer /health in 20 s (log: {})",
            g.log.display()
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime of the process, all its threads, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_ticks(self.pid()) as f64 / clk_tck()
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// utime + stime in clock ticks: fields 14 and 15 of `/proc/PID/stat`
/// (counted from the `)` that ends the command name, which may hold spaces).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    parse_cpu_ticks(&stat)
}

fn parse_cpu_ticks(stat: &str) -> u64 {
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// Clock ticks a second (`getconf CLK_TCK`; Linux's 100 if that fails).
fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// A port nobody listens on now (the gateway binds it a moment later).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs() -> QueueKnobs {
        QueueKnobs {
            max_in_flight: 256,
            max_waiting: 0,
            max_kv_usage: 0.98,
            engine_poll: Duration::from_millis(250),
            max_length: 1024,
            max_wait: Duration::from_secs(30),
            input_weight: 1.0,
            output_weight: 2.0,
        }
    }

    #[test]
    fn the_config_parses_with_tenants_keys_and_a_scaled_queue() {
        let urls = [
            "http://127.0.0.1:9000".to_owned(),
            "http://127.0.0.1:9001".to_owned(),
        ];
        let on = yaml(8080, "chat", &urls, Some(&knobs()), 0.25);
        assert!(on.contains("max_wait_ms: 7500\n"), "{on}");
        assert!(on.contains("engine_poll_ms: 63\n"), "{on}");
        assert!(on.contains("    vip:\n      priority: high\n"), "{on}");
        // printf %s kvgate-bench-vip-key | sha256sum
        let vip = hex::encode(Sha256::digest(b"kvgate-bench-vip-key"));
        assert!(on.contains(&vip), "{on}");
        let config = kvgate::Config::from_yaml(&on).unwrap_or_else(|e| panic!("{e}\n{on}"));
        assert_eq!(config.endpoints[0].instances.len(), 2);
        let off = yaml(8080, "chat", &urls, None, 0.25);
        assert!(!off.contains("queue:"), "{off}");
        kvgate::Config::from_yaml(&off).unwrap_or_else(|e| panic!("{e}\n{off}"));
    }

    #[test]
    fn cpu_ticks_are_counted_past_the_command_name() {
        let stat = "42 (kvgate serve) S 1 42 42 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 9 0";
        assert_eq!(parse_cpu_ticks(stat), 281);
        assert_eq!(parse_cpu_ticks(""), 0);
        assert!(cpu_ticks(std::process::id()) < u64::MAX);
    }
}
