//! A request path that is not UTF-8 once percent-decoded (`/endpoints/%ff/…`)
//! is a 400 in the error shape, before routing: axum's path extractor would
//! otherwise answer it itself, in plain text.

use axum::extract::Request;

use crate::error::{ApiError, ErrorKind};

pub fn check(req: &Request) -> Result<(), ApiError> {
    let decoded = percent_encoding::percent_decode_str(req.uri().path());
    if decoded.decode_utf8().is_err() {
        return Err(ApiError::new(
            ErrorKind::InvalidRequest,
            "the request path is not valid UTF-8 once percent-decoded",
        )
        .with_param("path"));
    }
    Ok(())
}
