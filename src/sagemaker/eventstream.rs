//! The `invocations-response-stream` answer: the upstream's body turned into
//! `application/vnd.amazon.eventstream` frames as botocore reads them. Each
//! upstream chunk becomes one `PayloadPart` event the moment it arrives; an
//! upstream failure mid-stream becomes one `ModelStreamError` exception event
//! and ends the stream. Nothing else is added (no keep-alive bytes: the
//! caller turns SSE pings off for this route). Framing and CRCs come from
//! `aws-smithy-eventstream`, the AWS SDK's own implementation.
//!
//! Dropping the returned body drops the upstream body inside it, so a client
//! that goes away cancels the upstream work as on every other route.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue as EventHeaderValue, Message};
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;

pub const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";
/// Where SageMaker puts the model's own content type on a stream.
pub const SAGEMAKER_CONTENT_TYPE: HeaderName =
    HeaderName::from_static("x-amzn-sagemaker-content-type");

fn header(name: &'static str, value: &'static str) -> Header {
    Header::new(name, EventHeaderValue::String(value.into()))
}

fn encode(message: &Message) -> Bytes {
    let mut out = Vec::with_capacity(message.payload().len() + 96);
    // Fails only for a payload over 16 MiB or more than 128 KiB of headers;
    // an upstream chunk is never that large, and an empty frame is safer than none.
    if write_message_to(message, &mut out).is_err() {
        out.clear();
    }
    Bytes::from(out)
}

/// One `PayloadPart` event carrying `bytes`.
pub fn payload_part(bytes: Bytes) -> Bytes {
    let message = Message::new(bytes)
        .add_header(header(":message-type", "event"))
        .add_header(header(":event-type", "PayloadPart"))
        .add_header(header(":content-type", "application/octet-stream"));
    encode(&message)
}

/// A `ModelStreamError` exception event.
pub fn model_stream_error(message: &str) -> Bytes {
    let payload = serde_json::json!({ "Message": message, "ErrorCode": "StreamBroken" });
    let message = Message::new(Bytes::from(payload.to_string()))
        .add_header(header(":message-type", "exception"))
        .add_header(header(":exception-type", "ModelStreamError"))
        .add_header(header(":content-type", "application/json"));
    encode(&message)
}

/// The client's response for a successful upstream answer on the stream route.
pub fn into_event_stream(resp: Response) -> Response {
    let (mut parts, body) = resp.into_parts();
    let upstream_type = parts
        .headers
        .remove(header::CONTENT_TYPE)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    parts.headers.insert(SAGEMAKER_CONTENT_TYPE, upstream_type);
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    // Proxies in front must not hold frames back.
    parts
        .headers
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    // The frames change the length; the coding would apply to the frames.
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_ENCODING);
    let frames = futures_util::stream::unfold(
        (body.into_data_stream(), false),
        |(mut inner, failed)| async move {
            if failed {
                return None;
            }
            loop {
                match inner.next().await {
                    Some(Ok(chunk)) if chunk.is_empty() => continue,
                    Some(Ok(chunk)) => {
                        return Some((
                            Ok::<_, std::convert::Infallible>(payload_part(chunk)),
                            (inner, false),
                        ));
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "upstream stream failed; sending ModelStreamError");
                        let frame =
                            model_stream_error(&format!("the model's stream broke off: {e}"));
                        return Some((Ok(frame), (inner, true)));
                    }
                    None => return None,
                }
            }
        },
    );
    Response::from_parts(parts, Body::from_stream(frames))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::read_message_from;

    #[test]
    fn frames_read_back_with_their_headers_and_payload() {
        let m = read_message_from(payload_part(Bytes::from_static(b"hello"))).unwrap();
        assert_eq!(m.payload().as_ref(), b"hello");
        let names: Vec<_> = m.headers().iter().map(|h| h.name().as_str()).collect();
        assert!(names.contains(&":event-type"));
        let m = read_message_from(model_stream_error("boom")).unwrap();
        let v: serde_json::Value = serde_json::from_slice(m.payload()).unwrap();
        assert_eq!(v["Message"], "boom");
    }
}
