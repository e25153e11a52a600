//! Request ids: the client's `x-request-id` is kept; otherwise a new UUIDv4,
//! formatted into a stack buffer. tower-http's `MakeRequestUuid` formats it
//! through `Display` into a `String` and parses that back: a few hundred
//! instructions a request for the same header.

use axum::http::{HeaderValue, Request};
use tower_http::request_id::{MakeRequestId, RequestId};

#[derive(Debug, Clone, Copy, Default)]
pub struct MakeId;

impl MakeRequestId for MakeId {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        let mut buf = uuid::Uuid::encode_buffer();
        let id = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
        HeaderValue::from_str(id).ok().map(RequestId::new)
    }
}
