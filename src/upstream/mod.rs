//! Upstream instances and the trying of them: in-flight accounting
//! ([`instance`]), sending with failover ([`forward`]) and the streamed
//! response body that releases its slot when it ends or is dropped ([`body`]),
//! upstream errors relayed in OpenAI's shape ([`relay_error`]), what the
//! client trusts for `https://` instances ([`tls`]), and the completion
//! tokens of streams that report no usage ([`completion`]).

mod body;
pub mod completion;
mod first_token;
mod forward;
mod headers;
mod relay_error;
mod usage;

pub use first_token::TokenEvent;
pub use forward::{Forward, forward};
