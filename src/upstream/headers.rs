//! Which headers cross the gateway: hop-by-hop headers (RFC 9110 §7.6.1) and
//! the client's credentials stay behind.

use axum::http::{HeaderMap, HeaderName, header};

/// Headers that describe one connection, never the message.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Headers for the upstream request: the client's minus hop-by-hop headers,
/// those named in `Connection`, `Host`, `Content-Length` (recomputed) and
/// `Authorization` and `x-api-key` (the client's credential is for kvgate,
/// not the upstream).
pub fn upstream_request(client: &HeaderMap) -> HeaderMap {
    let named_by_connection: Vec<String> = client
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    let mut out = HeaderMap::with_capacity(client.len());
    for (name, value) in client {
        if is_hop_by_hop(name)
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::AUTHORIZATION
            // Anthropic's SDKs send their key here.
            || name.as_str() == "x-api-key"
            // An AWS session token is a credential too (SigV4 clients send it).
            || name.as_str() == "x-amz-security-token"
            || named_by_connection.iter().any(|n| n == name.as_str())
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// Headers for the client's response: the upstream's minus hop-by-hop ones,
/// `server` (which engine and version runs behind the gateway is the
/// operator's business, not the client's) and `x-amzn-errortype` (on the
/// SageMaker wire kvgate says what an upstream failure was, as `ModelError`;
/// an upstream's own would skip that mapping).
pub fn client_response(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(upstream.len() + 2);
    for (name, value) in upstream {
        if !is_hop_by_hop(name)
            && name != axum::http::header::SERVER
            && name.as_str() != "x-amzn-errortype"
        {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn drops_hop_by_hop_auth_and_connection_named() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        let out = upstream_request(&h);
        assert_eq!(out.len(), 2);
        assert!(out.contains_key(header::CONTENT_TYPE));
        assert!(out.contains_key("x-request-id"));
    }

    #[test]
    fn the_upstream_server_header_is_not_relayed() {
        let mut h = HeaderMap::new();
        h.insert(header::SERVER, HeaderValue::from_static("uvicorn"));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        let out = client_response(&h);
        assert!(!out.contains_key(header::SERVER));
        assert!(out.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn aws_credentials_and_error_types_stay_on_their_side() {
        let mut h = HeaderMap::new();
        h.insert("x-amz-security-token", HeaderValue::from_static("session"));
        h.insert("x-amz-date", HeaderValue::from_static("20261201T000000Z"));
        let out = upstream_request(&h);
        assert!(!out.contains_key("x-amz-security-token"));
        assert!(out.contains_key("x-amz-date"));
        let mut h = HeaderMap::new();
        h.insert(
            "x-amzn-errortype",
            HeaderValue::from_static("InternalFailure"),
        );
        assert!(client_response(&h).is_empty());
    }
}
