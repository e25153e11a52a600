//! Pure routing-key machinery for kvgate: strict JSON parsing, RFC 8785 canonical
//! JSON, the prompt-prefix window of each API, and the 64-bit routing key.
//!
//! The gateway's analysis step runs, per request:
//!
//! ```text
//! bytes ─parse_strict─► Value ─{chat,messages,completions,native}_window─► window ─routing_key─► u64
//!                                                                   └─block_chain─► [u64] (cache-aware routing)
//! ```
//!
//! Nothing here is async, allocates without bound, or panics on any input: every
//! function is total over its arguments, so the crate can be fuzzed and property
//! tested without a server.

mod api;
mod canonical;
mod chain;
mod json_error;
mod key;
mod parse;
mod partition;
mod scan;
mod window;

pub use api::Api;
pub use canonical::write_canonical;
pub use chain::block_chain;
pub use json_error::{JsonError, JsonErrorKind};
pub use key::routing_key;
pub use parse::{MAX_DEPTH, parse_strict};
pub use partition::{MAX_PARTITION_ID_CHARS, is_valid_partition_id};
pub use window::{
    DEFAULT_PROMPT_MEMBERS, MESSAGE_BLOCK_TYPES, ShapeError, Window, chat_window,
    chat_window_with_history, completions_window, default_prompt_members, messages_window,
    messages_window_with_history, native_window,
};
