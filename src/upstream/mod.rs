//! One routed request, upstream and back: [`forward`] tries the plan's
//! instances in order; each try claims its instance and tells the KV feed
//! and the index what it will cache ([`dispatch`]), sends under the
//! first-byte timeout ([`attempt`]), and either fails over (nothing has
//! reached the client yet) or answers: errors relayed whole
//! ([`relay_error`]), successes streamed through a body that holds the slot
//! until it ends ([`respond`], [`body`]), usage read from the answer
//! ([`usage`], [`completion`]) to settle the tenant's tokens.

mod attempt;
mod body;
pub mod completion;
mod dispatch;
mod first_token;
mod forward;
mod headers;
mod relay_error;
mod respond;
mod usage;

pub use first_token::TokenEvent;
pub use forward::{Forward, forward};
