//! KV events: following what each vLLM instance stores and evicts, from its
//! ZeroMQ publisher (`--kv-events-config`), for the `kv_aware` strategy.
//!
//! [`wire`] decodes vLLM's messages, [`feed::Feed`] holds one publisher's
//! index and trust, [`subscriber`] is the task that keeps it current and
//! [`replay`] reads spans of a publisher's history. The
//! index itself is pure (`kvgate_routing::held`): one an endpoint, each
//! instance's blocks recorded there under its slot.

mod clock;
pub mod feed;
mod msgpack;
pub mod replay;
pub mod subscriber;
pub mod wire;

use std::sync::Arc;

pub use clock::stamp;
pub use feed::{Feed, Trust};

/// A feed and the task that follows it; dropping it stops the task.
#[derive(Debug)]
pub struct Subscription {
    pub feed: Arc<Feed>,
    task: tokio::task::AbortHandle,
}

impl Subscription {
    /// Start following `feed` on the current tokio runtime; `None` outside one
    /// (`kvgate check`, which only validates).
    pub fn start(feed: Feed) -> Option<Self> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let feed = Arc::new(feed);
        let task = handle
            .spawn(subscriber::run(Arc::clone(&feed)))
            .abort_handle();
        Some(Self { feed, task })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
        self.feed.stop();
    }
}
