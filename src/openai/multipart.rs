//! The `model` field of a multipart upload (`/v1/audio/transcriptions`), read
//! without holding the file: the form is parsed (by `multer`) only as far as
//! its `model` field, the bytes read so far are kept, and the request goes on
//! as those bytes followed by the rest of the client's body, unread. A client
//! that sends the file before the model (curl `-F` in that order) costs up to
//! the body limit of memory; the OpenAI SDKs send plain fields first.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http_body_util::{BodyExt, Limited};

use crate::error::{ApiError, ErrorKind};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, BoxError>> + Send>>;

/// The longest `model` value read (ids are short; this bounds the field).
const MAX_MODEL_BYTES: u64 = 1024;

/// What was read of the body, and the rest of it.
struct Shared {
    rest: Option<Chunks>,
    seen: Vec<Bytes>,
}

/// The client's body as multer reads it, keeping a copy of every chunk.
struct Tee(Arc<Mutex<Shared>>);

impl Stream for Tee {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut shared = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(rest) = shared.rest.as_mut() else {
            return Poll::Ready(None);
        };
        let next = rest.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(chunk))) = &next {
            let chunk = chunk.clone();
            shared.seen.push(chunk);
        }
        next
    }
}

/// The form's `model`, and the whole body to forward. Refuses a body that is
/// not `multipart/form-data` (415), has no `model` field (400), or passes
/// `limit` bytes (413) or `timeout` before the field.
pub async fn model_of(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<(String, Body), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let boundary = multer::parse_boundary(content_type).map_err(|_| {
        ApiError::new(
            ErrorKind::UnsupportedMediaType,
            "uploads must be multipart/form-data with a boundary",
        )
        .with_param("content-type")
    })?;
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        let n = len.to_str().ok().and_then(|s| s.parse::<u64>().ok());
        match n {
            Some(n) if n > limit as u64 => {
                return Err(ApiError::new(
                    ErrorKind::PayloadTooLarge,
                    format!("request body exceeds the limit of {limit} bytes"),
                ));
            }
            Some(_) => {}
            None => {
                return Err(ApiError::invalid(
                    "content-length",
                    "invalid content-length header",
                ));
            }
        }
    }
    let rest: Chunks = Box::pin(
        Limited::new(body, limit)
            .into_data_stream()
            .map(|r| r.map_err(|e| -> BoxError { e })),
    );
    let shared = Arc::new(Mutex::new(Shared {
        rest: Some(rest),
        seen: Vec::new(),
    }));
    let constraints = multer::Constraints::new()
        .size_limit(multer::SizeLimit::new().for_field("model", MAX_MODEL_BYTES));
    let mut form =
        multer::Multipart::with_constraints(Tee(Arc::clone(&shared)), boundary, constraints);
    let scan = async {
        while let Some(field) = form.next_field().await.map_err(form_error)? {
            if field.name() == Some("model") {
                return field.text().await.map_err(form_error);
            }
        }
        Err(ApiError::invalid("model", "the form has no `model` field"))
    };
    let model = tokio::time::timeout(timeout, scan).await.map_err(|_| {
        ApiError::new(
            ErrorKind::RequestTimeout,
            format!("the form's model field did not arrive within {timeout:?}"),
        )
    })??;
    drop(form);
    let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let seen = futures_util::stream::iter(std::mem::take(&mut shared.seen).into_iter().map(Ok));
    let body = match shared.rest.take() {
        Some(rest) => Body::from_stream(seen.chain(rest)),
        None => Body::from_stream(seen),
    };
    Ok((model, body))
}

fn form_error(e: multer::Error) -> ApiError {
    // The body limit surfaces as a stream error inside multer's.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        if c.downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            return ApiError::new(ErrorKind::PayloadTooLarge, "request body exceeds the limit");
        }
        if let multer::Error::StreamReadFailed(inner) = &e
            && inner
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
        {
            return ApiError::new(ErrorKind::PayloadTooLarge, "request body exceeds the limit");
        }
        cause = c.source();
    }
    ApiError::invalid("body", format!("malformed multipart form: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(fields: &[(&str, &str)]) -> (HeaderMap, String) {
        let mut body = String::new();
        for (name, value) in fields {
            body.push_str(&format!(
                "--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            ));
        }
        body.push_str("--XyZ--\r\n");
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "multipart/form-data; boundary=XyZ".parse().unwrap(),
        );
        (h, body)
    }

    async fn bytes(b: Body) -> String {
        String::from_utf8(b.collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn finds_the_model_and_forwards_every_byte() {
        let big = "a".repeat(100_000);
        for fields in [
            vec![("model", "m/1"), ("file", big.as_str())],
            vec![("file", big.as_str()), ("language", "en"), ("model", "m/1")],
        ] {
            let (h, body) = form(&fields);
            let chunks: Vec<Result<Bytes, std::io::Error>> = body
                .as_bytes()
                .chunks(7000)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let b = Body::from_stream(futures_util::stream::iter(chunks));
            let (model, out) = model_of(&h, b, 1 << 20, std::time::Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(model, "m/1");
            assert_eq!(bytes(out).await, body);
        }
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_route() {
        let secs = std::time::Duration::from_secs(5);
        let (h, body) = form(&[("file", "x")]);
        let e = model_of(&h, Body::from(body), 1 << 20, secs)
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind, e.param.as_deref()),
            (ErrorKind::InvalidRequest, Some("model"))
        );
        let (h, body) = form(&[("file", &"x".repeat(5000)), ("model", "m")]);
        let e = model_of(&h, Body::from(body), 1000, secs)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PayloadTooLarge);
        let e = model_of(&HeaderMap::new(), Body::empty(), 1000, secs)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnsupportedMediaType);
    }
}
