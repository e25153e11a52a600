//! [`TenantLive`]: one tenant's requests and tokens over the last minute,
//! and its refusals by reason since start; relaxed atomics only, updated
//! where admission already holds the tenant's state.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::Window;

/// Why a tenant's request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Concurrency,
    RequestsPerMinute,
    TokensPerMinute,
    Model,
    Queue,
}

impl Refusal {
    pub const ALL: [Refusal; 5] = [
        Refusal::Concurrency,
        Refusal::RequestsPerMinute,
        Refusal::TokensPerMinute,
        Refusal::Model,
        Refusal::Queue,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Concurrency => "max_concurrency",
            Refusal::RequestsPerMinute => "requests_per_minute",
            Refusal::TokensPerMinute => "tokens_per_minute",
            Refusal::Model => "model_not_allowed",
            Refusal::Queue => "queue",
        }
    }
}

#[derive(Debug, Default)]
pub struct TenantLive {
    /// Per second: admitted requests, tokens used (prompt + completion).
    pub minute: Window<2>,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl TenantLive {
    pub fn admitted(&self) {
        self.minute.add([1, 0]);
    }

    pub fn used(&self, tokens: u64) {
        self.minute.add([0, tokens]);
    }

    pub fn refused(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Relaxed);
    }

    /// Refusals since start, by reason.
    pub fn refusals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Refusal::ALL
            .iter()
            .map(|r| (r.as_str(), self.refused[*r as usize].load(Relaxed)))
    }
}
