//! The OpenAI (and vLLM) routes beyond chat and completions: which route a
//! request is, how its prompt is read for routing ([`responses`]), the
//! response ids that carry their instance ([`response_id`]), and the model
//! field of a multipart upload ([`multipart`]).

pub mod multipart;
pub mod response_id;
pub mod responses;
pub mod rewrite_stream;
