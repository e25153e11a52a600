//! The fleet: the runtime state built from config (endpoints, their
//! instances and policies), each instance's in-flight accounting and health,
//! and the background jobs that keep it current (health checks, capacity
//! probes, engine readings, discovery, warm-up, config reload, and the
//! state replicas share through Redis).

pub mod capacity;
pub mod client;
pub mod discovery;
mod endpoint;
pub mod engine_load;
pub mod health;
pub mod instance;
pub mod peers;
mod prefill_rate;
pub mod queue;
pub mod recent_work;
pub mod reload;
pub mod session_homes;
mod state;
pub mod tasks;
pub mod warmup;

pub use endpoint::{Endpoint, Seen};
pub use instance::{InflightGuard, Instance, PaceSample};
pub use state::{AppState, Runtime};
