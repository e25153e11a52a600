//! Answering a request the connection guard refused before hyper saw it.
//!
//! The answer is not built here: a stand-in request with the refused one's
//! method and path, carrying the [`ApiError`] as [`Refused`], goes through the
//! same router as every request, whose outermost layers give it a request id,
//! a log line, and the error shape that path gets ([`refused`] hands the
//! error back there). The response is then written out as HTTP/1.1 bytes.

use std::fmt::Write as _;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, Uri, header};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::BoxFuture;
use tower::ServiceExt;

use super::h1::{MAX_TARGET_BYTES, Refusal};
use crate::error::ApiError;

/// A request extension only the connection guard sets (nothing on the wire
/// can name an extension): answer with this error.
#[derive(Debug, Clone)]
pub struct Refused(pub ApiError);

/// The error a [`Refused`] stand-in request is to be answered with (by the
/// router's front layer, `middleware::front`).
pub fn refused(req: &mut Request) -> Option<ApiError> {
    req.extensions_mut().remove::<Refused>().map(|Refused(e)| e)
}

/// The refused request's answer, as bytes to write before closing.
pub fn answer(app: Router, refusal: Refusal) -> BoxFuture<'static, Bytes> {
    Box::pin(async move {
        let uri = refusal
            .path
            .as_deref()
            .filter(|p| p.starts_with('/') && p.len() <= MAX_TARGET_BYTES)
            .and_then(|p| p.parse::<Uri>().ok())
            .unwrap_or_else(|| Uri::from_static("/"));
        let method = refusal
            .method
            .as_deref()
            .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
            .filter(|m| m != Method::HEAD)
            .unwrap_or(Method::GET);
        let error = refusal
            .error
            .with_header(header::CONNECTION, HeaderValue::from_static("close"));
        let mut req = Request::new(Body::empty());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        req.headers_mut()
            .insert(header::HOST, HeaderValue::from_static("kvgate"));
        req.extensions_mut().insert(Refused(error));
        let resp = match app.oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
        to_bytes(resp).await
    })
}

async fn to_bytes(resp: Response) -> Bytes {
    let (parts, body) = resp.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let mut head = String::new();
    let status = parts.status;
    let _ = write!(
        head,
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let mut out = BytesMut::from(head.as_bytes());
    for (name, value) in &parts.headers {
        if [
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::CONNECTION,
        ]
        .contains(name)
        {
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.put_slice(&body);
    out.freeze()
}
