//! Request framing the RFCs forbid, refused before anything else reads the
//! request: a `Transfer-Encoding` other than plain `chunked` (RFC 9112 §6.1:
//! `chunked` must be last, and kvgate decodes no other coding), and an
//! HTTP/1.1 request without exactly one `Host` (RFC 9112 §3.2). Proxies in
//! front and behind may frame such requests differently: refusing them is
//! what keeps them from being smuggled.

use axum::extract::Request;
use axum::http::{Version, header};

use crate::error::{ApiError, ErrorKind};

fn bad(param: &str, message: &str) -> ApiError {
    ApiError::new(ErrorKind::InvalidRequest, message)
        .with_param(param)
        .with_header(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        )
}

pub fn check(req: &Request) -> Result<(), ApiError> {
    let h = req.headers();
    let te: Vec<&[u8]> = h
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let plain_chunked = match te.as_slice() {
        [] => true,
        [one] => one.trim_ascii().eq_ignore_ascii_case(b"chunked"),
        _ => false,
    };
    if !plain_chunked {
        return Err(bad(
            "transfer-encoding",
            "only `Transfer-Encoding: chunked` is accepted (no other coding, sent once)",
        ));
    }
    if matches!(req.version(), Version::HTTP_11 | Version::HTTP_10) {
        let hosts = h.get_all(header::HOST).iter().count();
        let required = req.version() == Version::HTTP_11;
        if hosts > 1 || (required && hosts == 0) {
            return Err(bad(
                "host",
                "an HTTP/1.1 request must carry exactly one Host header",
            ));
        }
    }
    Ok(())
}
