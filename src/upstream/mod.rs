//! Upstream instances and the trying of them: in-flight accounting
//! ([`instance`]), sending with failover ([`forward`]) and the streamed
//! response body that releases its slot when it ends or is dropped ([`body`]),
//! and upstream errors relayed in OpenAI's shape ([`relay_error`]).

mod body;
pub mod capacity;
mod first_token;
mod forward;
mod headers;
pub mod health;
mod instance;
mod relay_error;
mod usage;

pub use first_token::TokenEvent;
pub use forward::{Forward, forward};
pub use instance::{InflightGuard, Instance};
