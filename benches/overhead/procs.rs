//! The processes under test: finding nginx and HAProxy, starting them and
//! kvgate with their config files, and reading their CPU time and RSS from
//! `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A started process, killed when dropped.
pub struct Proc {
    child: Child,
    pub port: u16,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime of the process (all its threads, live and exited),
    /// in clock ticks: fields 14 and 15 of `/proc/PID/stat`.
    pub fn cpu_ticks(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // The command name (field 2) may hold spaces; count from its ')'.
        let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
    }

    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// Clock ticks a second (`getconf CLK_TCK`; 100, Linux's value, if that fails).
pub fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// `name` on PATH or in the sbin directories Debian installs daemons to.
pub fn find_bin(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Starts `bin args`, output discarded, and waits until `port` accepts.
pub fn start(bin: &Path, args: &[&str], port: u16, what: &str) -> Proc {
    let child = Command::new(bin)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {}: {e}", bin.display()));
    let mut p = Proc { child, port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return p;
        }
        assert!(p.alive(), "{what} exited at start (args {args:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on {port}");
}

/// Writes `config` to `dir/file` and returns its path as a string.
pub fn write_config(dir: &Path, file: &str, config: &str) -> String {
    let path = dir.join(file);
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_owned()
}

pub fn nginx(bin: &Path, dir: &Path, name: &str, config: &str, port: u16) -> Proc {
    let conf = write_config(dir, &format!("{name}.conf"), config);
    let err = dir.join(format!("{name}-startup.log"));
    let (d, e) = (dir.to_str().unwrap(), err.to_str().unwrap());
    start(bin, &["-p", d, "-e", e, "-c", &conf], port, name)
}

pub fn haproxy(bin: &Path, dir: &Path, config: &str, port: u16) -> Proc {
    let conf = write_config(dir, "haproxy.cfg", config);
    start(bin, &["-db", "-f", &conf], port, "haproxy")
}

pub fn kvgate(dir: &Path, name: &str, config: &str, port: u16) -> Proc {
    kvgate_at(
        Path::new(env!("CARGO_BIN_EXE_kvgate")),
        dir,
        name,
        config,
        port,
    )
}

/// [`kvgate`] from another build (`KVGATE_BASELINE`).
pub fn kvgate_at(bin: &Path, dir: &Path, name: &str, config: &str, port: u16) -> Proc {
    let conf = write_config(dir, &format!("{name}.yaml"), config);
    start(bin, &["serve", "--config", &conf], port, name)
}
