//! Reading a request body with a hard cap: a declared `content-length` over
//! the cap is refused before a byte is read, and a chunked body is cut off the
//! moment it passes the cap. Either way a 413 in the OpenAI shape. A body
//! that takes longer than `body_read_ms` to arrive is a 408: a slow upload
//! must not hold a connection and its memory for ever.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::{ApiError, ErrorKind};

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorKind::PayloadTooLarge,
        format!("request body exceeds the limit of {limit} bytes"),
    )
}

pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        let declared = len.to_str().ok().and_then(|s| s.parse::<u64>().ok());
        match declared {
            Some(n) if n > limit as u64 => return Err(too_large(limit)),
            Some(_) => {}
            None => {
                return Err(ApiError::new(
                    ErrorKind::InvalidRequest,
                    "invalid content-length header",
                )
                .with_param("content-length"));
            }
        }
    }
    let collected = tokio::time::timeout(timeout, Limited::new(body, limit).collect())
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorKind::RequestTimeout,
                format!("the request body did not arrive within {timeout:?}"),
            )
            .with_header(
                header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            )
        })?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(limit)),
        Err(e) => Err(refused_by_guard(e.as_ref()).unwrap_or_else(|| {
            ApiError::new(
                ErrorKind::InvalidRequest,
                format!("could not read the request body: {e}"),
            )
        })),
    }
}

/// The connection guard's own verdict on a body's framing, if that is what
/// ended it (it reaches here as the I/O error under hyper's body error).
fn refused_by_guard(e: &(dyn std::error::Error + 'static)) -> Option<ApiError> {
    let mut cause = Some(e);
    while let Some(err) = cause {
        if let Some(r) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<crate::server::conn::BodyRefused>())
        {
            return Some(r.0.clone());
        }
        cause = err.source();
    }
    None
}
