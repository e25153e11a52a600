//! The proxy path's HTTP client: hyper-util's pooled HTTP/1 client over
//! rustls, called directly. reqwest (kept for health checks, capacity probes,
//! warm-up and JWKS) wraps the same hyper client in a redirect layer and
//! converts and re-parses the URL twice a request: about a sixth of a proxied
//! request's instructions (bench/results/proxy-profile.md).
//!
//! One client (one connection pool) per connection worker ([`Proxies`]): a
//! pooled upstream connection is a task on the worker that opened it, so a
//! request on another worker would wake that one twice a request.

use std::cell::Cell;
use std::time::Duration;

use axum::body::Body;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::tls::UpstreamTls;

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
fn build(tls: rustls::ClientConfig, connect: Duration) -> Proxy {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        // HTTP/1 to every instance, TLS or not: the engines speak it.
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(4))
        .pool_max_idle_per_host(1024)
        .pool_timer(TokioTimer::new())
        .build(https)
}

/// One [`Proxy`] per connection worker, each with its own pool.
#[derive(Debug, Clone)]
pub struct Proxies(Vec<Proxy>);

thread_local! {
    /// The connection worker this thread is; 0 for any other thread.
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Mark the calling thread as connection worker `i` (`server/cores.rs`).
pub fn set_worker(i: usize) {
    WORKER.with(|w| w.set(i));
}

impl Proxies {
    /// `workers` clients (at least one) with `tls`'s trust, read once.
    pub fn build(
        tls: &UpstreamTls,
        connect: Duration,
        workers: usize,
    ) -> Result<Self, rustls::Error> {
        let config = tls.client_config()?;
        // Not `Client::clone`, which shares the pool: a build each.
        Ok(Self(
            (0..workers.max(1))
                .map(|_| build(config.clone(), connect))
                .collect(),
        ))
    }

    /// The calling worker's client.
    pub fn here(&self) -> &Proxy {
        let i = WORKER.with(Cell::get);
        &self.0[i % self.0.len()]
    }
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
