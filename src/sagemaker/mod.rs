//! SageMaker's wire, so that boto3's `sagemaker-runtime` works unchanged on
//! the `/endpoints/{name}/…` routes: its errors ([`error`]), the event-stream
//! answer of `invocations-response-stream` ([`eventstream`]), SigV4-signed
//! callers ([`sigv4`]) and the response headers SageMaker sends; and
//! [`import`], SageMaker endpoint configs as kvgate endpoints.

pub mod error;
pub mod eventstream;
pub mod import;

use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;

/// The production variant that answered: kvgate's instance id.
pub const INVOKED_VARIANT: HeaderName =
    HeaderName::from_static("x-amzn-invoked-production-variant");

/// Name the instance that answered, as SageMaker names the variant.
pub fn invoked_variant(resp: &mut Response, instance_id: &str) {
    if let Ok(v) = HeaderValue::from_str(instance_id) {
        resp.headers_mut().insert(INVOKED_VARIANT, v);
    }
}
