//! A `redis-server` for one run of replicas as processes (`cluster.redis`):
//! a loopback port, no persistence, killed when dropped; and its `INFO
//! stats` counters, read before and after a run to say what sharing cost.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running `redis-server`.
pub struct RedisProc {
    child: Child,
    pub port: u16,
}

/// Commands and bytes Redis has handled, from `INFO stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    pub commands: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl Traffic {
    pub fn since(&self, before: &Traffic) -> Traffic {
        Traffic {
            commands: self.commands.saturating_sub(before.commands),
            bytes_in: self.bytes_in.saturating_sub(before.bytes_in),
            bytes_out: self.bytes_out.saturating_sub(before.bytes_out),
        }
    }
}

impl RedisProc {
    pub async fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("redis-server (apt-get install redis-server): {e}"))?;
        let redis = Self { child, port };
        for _ in 0..400 {
            if redis.traffic().await.is_some() {
                return Ok(redis);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        anyhow::bail!("redis-server did not answer on port {port}")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `INFO stats`'s counters; `None` if Redis does not answer.
    pub async fn traffic(&self) -> Option<Traffic> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        s.write_all(b"INFO stats\r\n").await.ok()?;
        let mut buf = vec![0u8; 16 * 1024];
        let mut text = String::new();
        // A bulk string: read until its end (the reply is small).
        while !text.contains("total_net_output_bytes") || !text.ends_with("\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf))
                .await
                .ok()?
                .ok()?;
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
        };
        Some(Traffic {
            commands: field("total_commands_processed")?,
            bytes_in: field("total_net_input_bytes")?,
            bytes_out: field("total_net_output_bytes")?,
        })
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
