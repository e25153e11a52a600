//! The layers every request passes before its route's handler, one concern
//! a file: the front checks (refusals from the connection guard, framing,
//! undecodable paths) and the error shape of SageMaker's and Anthropic's
//! routes; the admin token; and the capped body read the pipeline uses.
//! The stack itself is assembled in [`crate::api::router`], one layer a line.

pub mod admin;
pub mod body_limit;
pub mod framing;
pub mod front;
pub mod path;
