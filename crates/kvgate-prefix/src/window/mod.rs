//! The prompt-prefix *window* of each API: the part of a body that decides where
//! it is routed. Equal prompts must give equal windows whatever else differs.

mod budget;
mod chat;
mod completions;
mod messages;
mod native;
mod opening;
mod shape_error;

pub use chat::{chat_window, chat_window_with_history};
pub use completions::completions_window;
pub use messages::{MESSAGE_BLOCK_TYPES, messages_window, messages_window_with_history};
pub use native::{DEFAULT_PROMPT_MEMBERS, default_prompt_members, native_window};
pub use opening::Window;
pub use shape_error::ShapeError;
