//! Live figures for the console (`crate::console`): fixed rings that the
//! request path updates with a few relaxed atomic operations and never a
//! lock, and that only a viewer reads. Nothing here allocates per request
//! except one routing [`Decision`] (an `Arc` swapped into a ring slot).
//!
//! With nobody watching, the cost is those atomics and that record; with
//! viewers, they read the same atomics on their own tasks, so the request
//! path neither waits for them nor takes a lock they hold.

pub mod decisions;
pub mod tenant;
pub mod ttft;
pub mod window;

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

pub use decisions::{Decision, Decisions};
pub use tenant::{Refusal, TenantLive};
pub use ttft::TtftHistory;
pub use window::Window;

/// Seconds since this process first asked (the rings' clock).
pub fn now_s() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs()
}

/// Wall-clock milliseconds since the Unix epoch (what a viewer shows).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One instance's last minute of tokens and its 15 minutes of TTFT.
#[derive(Debug, Default)]
pub struct InstanceLive {
    /// Per second: answers with usage, prompt tokens, cached tokens.
    pub minute: Window<3>,
    pub ttft: TtftHistory,
}

/// When and by what the running config was last (re)built.
#[derive(Debug, Clone)]
pub struct Reload {
    pub at_ms: u64,
    /// `start`, `file`, `SIGHUP`, `ConfigMap`, `discovery`.
    pub by: String,
    /// Reloads since start (discovery rebuilds included).
    pub count: u64,
}

/// A gateway's live state that outlives a config reload: the decision ring
/// and the reload note. Carried from runtime to runtime.
#[derive(Debug)]
pub struct Live {
    pub decisions: Decisions,
    reload: ArcSwap<Reload>,
    pub started_ms: u64,
}

impl Default for Live {
    fn default() -> Self {
        let at_ms = unix_ms();
        Self {
            decisions: Decisions::default(),
            reload: ArcSwap::from_pointee(Reload {
                at_ms,
                by: "start".to_owned(),
                count: 0,
            }),
            started_ms: at_ms,
        }
    }
}

impl Live {
    /// The config was rebuilt now, by `by`.
    pub fn reloaded(&self, by: &str) {
        let count = self.reload.load().count + 1;
        self.reload.store(std::sync::Arc::new(Reload {
            at_ms: unix_ms(),
            by: by.to_owned(),
            count,
        }));
    }

    pub fn last_reload(&self) -> Reload {
        Reload::clone(&self.reload.load())
    }
}
