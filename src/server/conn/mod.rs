//! One client connection, from accept to close: hyper's HTTP/1 and HTTP/2
//! behind the [`guard`] (framing checks, header-read clock, the gateway's
//! own answers to what it refuses, lingering close), an idle timer, and
//! `connection: close` on answers that leave a request body unread.
//!
//! - A request head must arrive within `server.timeouts.header_read_ms` from
//!   its first byte (the first one from the accept): HTTP/1 gets a 408 in the
//!   error shape; an HTTP/2 header block that stalls closes the connection.
//! - A connection with no request in flight and none arriving is closed after
//!   `server.timeouts.client_idle_ms`, HTTP/1 keep-alive and HTTP/2 alike
//!   (HTTP/2 with a GOAWAY); HTTP/2 connections are also pinged every
//!   `server.http2_keepalive_ms` and closed when a ping goes unanswered.
//! - An HTTP/2 connection must open its first stream within the header-read
//!   time of the accept, plus a second.
//!
//! [`serve`] is what the accept loop runs for each socket; the fuzz target
//! runs it on in-memory streams.

mod guard;
pub mod h1;
pub mod h2;
pub mod render;
mod streams;

use std::convert::Infallible;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use futures_util::task::AtomicWaker;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tower::ServiceExt;

pub use guard::{BodyRefused, LINGER_BYTES, LINGER_TIME};
pub use streams::StreamExecutor;

use crate::config::ServerConfig;

/// The per-connection limits, read once from config (a reload changes neither
/// the listener nor its timeouts).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read: Duration,
    pub client_idle: Duration,
}

impl Limits {
    pub fn of(server: &ServerConfig) -> Self {
        Self {
            header_read: server.timeouts.header_read,
            client_idle: server.timeouts.client_idle,
        }
    }
}

/// hyper's connection builder, HTTP/1 and HTTP/2 by sniffing.
pub type ConnBuilder = Builder<StreamExecutor>;

/// The builder every connection is served with, from config; HTTP/2 streams
/// run on `streams`.
pub fn builder(server: &ServerConfig, streams: StreamExecutor) -> ConnBuilder {
    let mut b = Builder::new(streams);
    // The guard times request heads (answering 408); hyper's own header
    // timer would close silently and also counts keep-alive idleness, which
    // is `client_idle_ms`'s business.
    b.http1().timer(TokioTimer::new()).header_read_timeout(None);
    let h2 = &mut b.http2();
    h2.timer(TokioTimer::new())
        .max_header_list_size(h1::MAX_HEAD_BYTES as u32);
    if let Some(every) = server.http2_keepalive {
        h2.keep_alive_interval(every).keep_alive_timeout(every);
    }
    b
}

/// What the guard, the service and the idle timer share about one connection.
pub struct Shared {
    in_flight: AtomicUsize,
    /// A request head (or HTTP/2 header block) is arriving.
    receiving: AtomicBool,
    started: AtomicBool,
    http1: AtomicBool,
    idle_since: Mutex<Instant>,
    /// The guard, waiting for hyper to be idle before it ends the input.
    reader: AtomicWaker,
    /// The idle timer, to look again.
    changed: Notify,
}

impl Shared {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            receiving: AtomicBool::new(false),
            started: AtomicBool::new(false),
            http1: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
            reader: AtomicWaker::new(),
            changed: Notify::new(),
        }
    }

    fn touch(&self) {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.changed.notify_one();
    }

    /// Requests are in flight; wake `cx` when the last one ends.
    fn busy(&self, cx: &Context<'_>) -> bool {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.reader.register(cx.waker());
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn set_receiving(&self, on: bool) {
        if self.receiving.swap(on, Ordering::AcqRel) != on {
            self.touch();
        }
    }

    fn set_http1(&self) {
        self.http1.store(true, Ordering::Release);
    }

    fn enter(self: &Arc<Self>) -> InFlight {
        self.started.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        InFlight(Arc::clone(self))
    }

    /// When the connection will have been idle for `idle`, if it is idle now.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        let quiet =
            self.in_flight.load(Ordering::Acquire) == 0 && !self.receiving.load(Ordering::Acquire);
        quiet.then(|| *self.idle_since.lock().unwrap_or_else(|e| e.into_inner()) + idle)
    }
}

/// One request from the service call until its response body is done.
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.touch();
            self.0.reader.wake();
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its request's [`InFlight`].
    struct Held<B> {
        #[pin]
        inner: B,
        in_flight: InFlight,
    }
}

impl<B: http_body::Body> http_body::Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A request body that says when it was read to its end.
    struct Tracked {
        #[pin]
        inner: Incoming,
        read_all: Arc<AtomicBool>,
    }
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.read_all.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// After `graceful_shutdown` for idleness, how long the connection may take
/// to close (a lingering close included) before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(LINGER_TIME.as_secs() + 1);

/// Serve one client connection until it closes, or until `stop` turns true
/// and its in-flight requests are done.
pub async fn serve<IO>(
    io: IO,
    builder: Arc<ConnBuilder>,
    app: Router,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = Arc::new(Shared::new());
    let guard = guard::Guard::new(io, Arc::clone(&shared), app.clone(), limits.header_read);
    let in_service = Arc::clone(&shared);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let in_flight = in_service.enter();
        let app = app.clone();
        async move {
            let http1 = req.version() <= Version::HTTP_11;
            let (parts, body) = req.into_parts();
            let read_all = Arc::new(AtomicBool::new(body.is_end_stream()));
            let body = Tracked {
                inner: body,
                read_all: Arc::clone(&read_all),
            };
            let Ok(mut resp) = app.oneshot(Request::from_parts(parts, body)).await;
            if http1 && !read_all.load(Ordering::Acquire) {
                // The rest of the body is still on the wire: this connection
                // cannot carry another request (the guard lingers to drain it).
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(resp.map(|inner| Body::new(Held { inner, in_flight })))
        }
    });
    let mut conn = pin!(builder.serve_connection(TokioIo::new(guard), service));
    let far = Duration::from_secs(365 * 24 * 3600);
    let mut first_stream = pin!(tokio::time::sleep(
        limits.header_read + Duration::from_secs(1)
    ));
    let mut idle = pin!(tokio::time::sleep(far));
    let mut closing = pin!(tokio::time::sleep(far));
    let mut stopping = false;
    loop {
        let idle_at = if stopping {
            None
        } else {
            shared.idle_deadline(limits.client_idle)
        };
        if let Some(at) = idle_at {
            idle.as_mut().reset(at);
        }
        let waiting_first =
            !shared.started.load(Ordering::Acquire) && !shared.http1.load(Ordering::Acquire);
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // HTTP/1 heads are the guard's; this is for a connection that
            // speaks HTTP/2 (or nothing) and opens no stream.
            () = &mut first_stream, if waiting_first => {
                if !shared.started.load(Ordering::Acquire) && !shared.http1.load(Ordering::Acquire) {
                    tracing::debug!(header_read = ?limits.header_read, "no request in time; closing the connection");
                    return;
                }
            }
            () = &mut idle, if idle_at.is_some() => {
                let still = shared.idle_deadline(limits.client_idle);
                if still.is_some_and(|at| at <= Instant::now()) {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                    closing.as_mut().reset(Instant::now() + CLOSE_GRACE);
                }
            }
            () = shared.changed.notified() => {}
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = &mut closing => return,
        }
    }
}
