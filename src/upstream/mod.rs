//! Upstream instances and the trying of them: in-flight accounting
//! ([`instance`]), sending with failover ([`forward`]) and the streamed
//! response body that releases its slot when it ends or is dropped ([`body`]),
//! upstream errors relayed in OpenAI's shape ([`relay_error`]), what the
//! client trusts for `https://` instances ([`tls`]), and the completion
//! tokens of streams that report no usage ([`completion`]).

mod body;
pub mod capacity;
pub mod client;
pub mod completion;
pub mod engine_load;
mod first_token;
mod forward;
mod headers;
pub mod health;
pub mod instance;
mod prefill_rate;
mod recent_work;
mod relay_error;
pub mod tls;
mod usage;

pub use first_token::TokenEvent;
pub use forward::{Forward, forward};
pub use instance::{InflightGuard, Instance};
