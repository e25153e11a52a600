//! The connection guard: the client's socket as hyper sees it.
//!
//! Reads go through the framing checkers first ([`super::h1`] holds each
//! HTTP/1 head back until it is complete and acceptable; [`super::h2`] only
//! watches). When a head is refused, hyper is given end-of-input at that
//! message boundary, once the requests before it are answered, and the
//! gateway's own answer is written when hyper closes the connection
//! (`poll_shutdown`), after hyper's. A body refused mid-way becomes an I/O
//! error, which hyper hands to the service reading that body. The header-read
//! clock runs here too, so a slow head gets a 408 in the error shape rather
//! than hyper's silent close.
//!
//! Closing is a lingering close, as nginx does: after the last answer the
//! write side is shut, and if the client may still be sending a request (a
//! body the gateway refused unread: 413, 401), up to [`LINGER_BYTES`] are
//! read and dropped for at most [`LINGER_TIME`]. Without it the kernel resets
//! a socket closed with unread data, and a client still writing its body
//! (Python's `http.client` does so before reading) sees `EPIPE`/`ECONNRESET`
//! instead of the status.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::h1::{Framing, Refusal};
use super::h2::{Frames, PREFACE};
use super::{Shared, render};

/// Most bytes read and dropped after answering a request whose body was not read.
pub const LINGER_BYTES: usize = 16 << 20;
/// Longest the lingering close waits for the client to finish sending.
pub const LINGER_TIME: Duration = Duration::from_secs(5);

/// What a refused request body looks like to hyper and then to the service.
#[derive(Debug)]
pub struct BodyRefused(pub crate::error::ApiError);

impl std::fmt::Display for BodyRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.message)
    }
}

impl std::error::Error for BodyRefused {}

enum Mode {
    /// Not yet known whether this is HTTP/1 or HTTP/2 with prior knowledge.
    Sniff,
    H1(Framing),
    H2(Frames),
}

/// Why reads stopped.
enum Stop {
    /// A head was refused: end of input once hyper has nothing in flight.
    Head,
    /// A body was refused: an error for whoever reads it.
    Body(crate::error::ApiError),
    /// Nothing to answer (no request began in time, or an HTTP/2 header block
    /// stalled): the connection is dropped.
    Drop,
}

enum Closing {
    Open,
    Render(BoxFuture<'static, Bytes>),
    Write(Bytes),
    Shut,
    Linger { left: usize },
    Done,
}

pub struct Guard<IO> {
    io: IO,
    mode: Mode,
    /// Bytes read but not yet checked to the end (an incomplete head).
    pending: BytesMut,
    /// Checked bytes hyper has not taken yet.
    ready: BytesMut,
    stop: Option<Stop>,
    /// The refused request, answered when hyper closes.
    refusal: Option<Refusal>,
    header_read: Duration,
    clock: Pin<Box<Sleep>>,
    clock_armed: bool,
    closing: Closing,
    linger_until: Pin<Box<Sleep>>,
    shared: Arc<Shared>,
    app: Router,
}

impl<IO> Guard<IO> {
    pub fn new(io: IO, shared: Arc<Shared>, app: Router, header_read: Duration) -> Self {
        Self {
            io,
            mode: Mode::Sniff,
            pending: BytesMut::new(),
            ready: BytesMut::new(),
            stop: None,
            refusal: None,
            header_read,
            // The first request's head, whatever the protocol, is on the clock
            // from the accept.
            clock: Box::pin(tokio::time::sleep(header_read)),
            clock_armed: true,
            closing: Closing::Open,
            linger_until: Box::pin(tokio::time::sleep(LINGER_TIME)),
            shared,
            app,
        }
    }

    /// Whether a request may still be on its way in (linger before closing).
    fn mid_request(&self) -> bool {
        match &self.mode {
            Mode::H1(f) => !f.at_boundary() || !self.pending.is_empty() || self.refusal.is_some(),
            Mode::Sniff | Mode::H2(_) => false,
        }
    }

    fn arm(&mut self, on: bool) {
        if on && !self.clock_armed {
            self.clock.as_mut().reset(Instant::now() + self.header_read);
        }
        self.clock_armed = on;
        self.shared.set_receiving(on);
    }

    /// New bytes from the client.
    fn take(&mut self, got: &[u8]) {
        match &mut self.mode {
            Mode::Sniff => {
                self.pending.extend_from_slice(got);
                let n = self.pending.len().min(PREFACE.len());
                if self.pending[..n] != PREFACE[..n] {
                    self.mode = Mode::H1(Framing::default());
                    self.shared.set_http1();
                    self.check_h1(0);
                } else if n == PREFACE.len() {
                    let mut frames = Frames::default();
                    frames.feed(&self.pending);
                    self.ready.extend_from_slice(&self.pending.split());
                    self.mode = Mode::H2(frames);
                    // The preface is in: the first stream's deadline is the
                    // connection's business (see `super::serve`).
                    self.arm(false);
                }
            }
            Mode::H1(_) => {
                let seen = self.pending.len();
                self.pending.extend_from_slice(got);
                self.check_h1(seen);
            }
            Mode::H2(frames) => {
                frames.feed(got);
                let in_header = frames.in_header();
                self.ready.extend_from_slice(got);
                self.arm(in_header);
            }
        }
    }

    fn check_h1(&mut self, seen: usize) {
        let Mode::H1(framing) = &mut self.mode else {
            return;
        };
        let scan = framing.scan(&self.pending, seen);
        let passed = self.pending.split_to(scan.pass);
        self.ready.extend_from_slice(&passed);
        if let Some(refusal) = scan.refuse {
            self.pending.clear();
            self.stop = Some(if refusal.in_body {
                Stop::Body(refusal.error)
            } else {
                self.refusal = Some(refusal);
                Stop::Head
            });
            self.arm(false);
            return;
        }
        // The clock runs from a head's first byte to its last.
        self.arm(!self.pending.is_empty());
    }

    fn on_clock(&mut self) {
        self.clock_armed = false;
        self.shared.set_receiving(false);
        match &self.mode {
            Mode::H1(_) if !self.pending.is_empty() => {
                self.refusal = Some(Refusal::head_timeout(&self.pending, self.header_read));
                self.pending.clear();
                self.stop = Some(Stop::Head);
            }
            _ => self.stop = Some(Stop::Drop),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(out.remaining());
                out.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            match &this.stop {
                None => {}
                Some(Stop::Head) => {
                    // hyper must be idle when it sees the end, or it would drop
                    // the answer it is still writing.
                    if this.shared.busy(cx) {
                        return Poll::Pending;
                    }
                    return Poll::Ready(Ok(()));
                }
                Some(Stop::Body(e)) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        BodyRefused(e.clone()),
                    )));
                }
                Some(Stop::Drop) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no request head in time",
                    )));
                }
            }
            if this.clock_armed && this.clock.as_mut().poll(cx).is_ready() {
                this.on_clock();
                continue;
            }
            // Uninitialised: zeroing 16 KiB on every read (most of them find
            // a few hundred bytes, or none) was a third of the gateway's
            // instructions under load.
            let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
            let mut rb = ReadBuf::uninit(&mut buf);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                // The client is done: an incomplete head is simply dropped.
                this.pending.clear();
                this.arm(false);
                return Poll::Ready(Ok(()));
            }
            this.take(rb.filled());
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    /// hyper is done: answer a refused request, shut the write side, linger.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.closing {
                Closing::Open => {
                    this.closing = match this.refusal.clone() {
                        Some(r) => Closing::Render(render::answer(this.app.clone(), r)),
                        None => Closing::Shut,
                    };
                }
                Closing::Render(f) => {
                    let bytes = ready!(f.as_mut().poll(cx));
                    this.closing = Closing::Write(bytes);
                }
                Closing::Write(bytes) => {
                    while bytes.has_remaining() {
                        match ready!(Pin::new(&mut this.io).poll_write(cx, bytes.chunk())) {
                            Ok(0) | Err(_) => {
                                this.closing = Closing::Done;
                                return Poll::Ready(Ok(()));
                            }
                            Ok(n) => bytes.advance(n),
                        }
                    }
                    let _ = ready!(Pin::new(&mut this.io).poll_flush(cx));
                    this.closing = Closing::Shut;
                }
                Closing::Shut => {
                    let shut = ready!(Pin::new(&mut this.io).poll_shutdown(cx));
                    this.closing = if shut.is_ok() && this.mid_request() {
                        this.linger_until
                            .as_mut()
                            .reset(Instant::now() + LINGER_TIME);
                        Closing::Linger { left: LINGER_BYTES }
                    } else {
                        Closing::Done
                    };
                }
                Closing::Linger { left } => {
                    if this.linger_until.as_mut().poll(cx).is_ready() {
                        this.closing = Closing::Done;
                        continue;
                    }
                    let mut buf = [0u8; 16 * 1024];
                    let mut rb = ReadBuf::new(&mut buf);
                    let read = ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb));
                    let n = rb.filled().len();
                    if read.is_err() || n == 0 || n >= *left {
                        this.closing = Closing::Done;
                    } else {
                        *left -= n;
                    }
                }
                Closing::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}
