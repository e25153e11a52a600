//! Request layers, one concern a file. The stack itself is assembled in
//! [`crate::api::router`], one layer a line.

pub mod admin;
pub mod admit;
pub mod auth;
pub mod body_limit;
pub mod canonicalise;
pub mod claim;
pub mod count;
pub mod framing;
pub mod front;
pub mod path;
