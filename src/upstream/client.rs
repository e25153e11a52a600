//! The proxy path's HTTP client: hyper-util's pooled HTTP/1 client over
//! rustls, called directly. reqwest (kept for health checks, capacity probes,
//! warm-up and JWKS) wraps the same hyper client in a redirect layer and
//! converts and re-parses the URL twice a request: about a sixth of a proxied
//! request's instructions (bench/results/proxy-profile.md).

use std::time::Duration;

use axum::body::Body;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::tls::UpstreamTls;

/// Why the upstream clients could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Reqwest(#[from] reqwest::Error),
    #[error("upstream TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// Requests to instances, `http://` and `https://` alike.
pub type Proxy = Client<HttpsConnector<HttpConnector>, Body>;

/// The client, with `upstream.tls`'s trust and the connect timeout. Pooled
/// connections idle for less than uvicorn's (vLLM, SGLang) and llama-server's
/// 5 s keep-alive: reusing one the server has just closed would fail the
/// request over and cool a healthy instance down.
pub fn build(tls: &UpstreamTls, connect: Duration) -> Result<Proxy, rustls::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.client_config()?)
        .https_or_http()
        // HTTP/1 to every instance, TLS or not: the engines speak it.
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(4))
        .pool_max_idle_per_host(1024)
        .pool_timer(TokioTimer::new())
        .build(https))
}

/// Whether a request error is a timeout (the connect timeout, here).
pub fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cur = err.source();
    }
    false
}
