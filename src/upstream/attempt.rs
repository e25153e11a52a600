//! One timed send to one instance, turned into what `forward` does next:
//! answer with the headers that came, try the next instance after a failed
//! connection, or give up with a 504 when no headers came in time (the
//! instance may be working on it: a second copy elsewhere would double the
//! GPU work). The instance's health is marked by what happened.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Response;
use hyper::body::Incoming;

use crate::error::{ApiError, ErrorKind};
use crate::fleet::{Instance, Runtime};
use crate::telemetry;

/// What a send came to.
pub enum Sent {
    /// Response headers, and how long they took.
    Answered(Response<Incoming>, Duration),
    /// The connection failed or timed out: nothing reached the instance.
    Failed(ErrorKind, &'static str),
    /// No response headers within `timeouts.first_byte`.
    TimedOut(ApiError),
}

pub async fn send(
    runtime: &Runtime,
    endpoint: &str,
    instance: &Instance,
    request: axum::http::Request<Body>,
) -> Sent {
    let server = &runtime.config.server;
    let sent = Instant::now();
    let response = runtime.proxies.here().request(request);
    match tokio::time::timeout(server.timeouts.first_byte, response).await {
        Err(_) => {
            // A hung instance is a failing one: timeouts count toward passive
            // ejection like 5xx answers, or it would keep drawing its share.
            instance.server_error(server.failover_cooldown);
            tracing::warn!(endpoint, instance = %instance.id, "no response headers in time");
            Sent::TimedOut(ApiError::new(
                ErrorKind::GatewayTimeout,
                format!(
                    "the upstream sent no response within {:?}",
                    server.timeouts.first_byte
                ),
            ))
        }
        Ok(Err(e)) => {
            instance.connect_failed(server.failover_cooldown);
            tracing::warn!(endpoint, instance = %instance.id, error = %error_chain(&e), "upstream connection failed; trying the next instance");
            telemetry::retry(endpoint, &instance.id, "connect");
            // The client learns what happened, not where: instance URLs stay internal.
            if crate::fleet::client::is_timeout(&e) {
                Sent::Failed(ErrorKind::GatewayTimeout, "connection timed out")
            } else {
                Sent::Failed(ErrorKind::BadGateway, "connection failed")
            }
        }
        Ok(Ok(r)) => {
            if r.status().is_server_error() {
                instance.server_error(server.failover_cooldown);
            } else {
                instance.succeeded();
            }
            Sent::Answered(r, sent.elapsed())
        }
    }
}

/// The client's Display hides the cause ("client error (Connect)"); show the chain.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
