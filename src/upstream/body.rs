//! The response body on its way to the client: chunks pass through as they
//! arrive; silence longer than the idle timeout ends the stream; usage, the
//! first token and the gap between tokens are read in passing; and the in-flight slot is released when the body ends or is
//! dropped (client gone), which also drops — and so closes — the upstream
//! connection, making vLLM abort the generation.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::{Instant, Sleep};

use super::first_token::FirstToken;
use super::usage::{Usage, UsageScanner};
use crate::fleet::instance::InflightGuard;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Called once with the reported usage when the body finishes or is dropped,
/// and the chunks kept for counting (see [`UpstreamBody::keep_transcript`]).
pub type OnDone = Box<dyn FnOnce(Option<Usage>, Option<Vec<Bytes>>) + Send>;

/// Most bytes of a stream kept for counting its completion tokens.
const TRANSCRIPT_LIMIT: usize = 16 << 20;

pin_project_lite::pin_project! {
    pub struct UpstreamBody<S> {
        #[pin]
        inner: S,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        keepalive: Option<KeepAlive>,
        scanner: UsageScanner,
        // Time to first token: the probe and when the request arrived.
        first_token: Option<(FirstToken, std::time::Instant)>,
        guard: Option<InflightGuard>,
        on_done: Option<OnDone>,
        transcript: Option<Vec<Bytes>>,
        kept: usize,
        // The console's record of this request, told its first token.
        decision: Option<std::sync::Arc<crate::telemetry::live::Decision>>,
    }

    impl<S> PinnedDrop for UpstreamBody<S> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(done) = this.on_done.take() {
                done(this.scanner.usage(), this.transcript.take());
            }
            this.guard.take();
        }
    }
}

/// SSE keep-alive: a comment line sent after `every` of silence, only between
/// events (after a blank line), so no event is ever split.
pub struct KeepAlive {
    every: Duration,
    timer: Pin<Box<Sleep>>,
    /// The last bytes sent, to know whether we stand between two events.
    last: [u8; 4],
}

impl KeepAlive {
    pub fn new(every: Duration) -> Self {
        // Before the first byte we are between events too.
        Self {
            every,
            timer: Box::pin(tokio::time::sleep(every)),
            last: *b"\n\n\n\n",
        }
    }

    fn saw(&mut self, chunk: &[u8]) {
        for &b in chunk.iter().rev().take(4).rev() {
            self.last.rotate_left(1);
            self.last[3] = b;
        }
        self.timer.as_mut().reset(Instant::now() + self.every);
    }

    fn between_events(&self) -> bool {
        self.last[2..] == *b"\n\n" || self.last == *b"\r\n\r\n"
    }
}

pub const PING: &[u8] = b": ping\n\n";

impl<S> UpstreamBody<S> {
    pub fn new(
        inner: S,
        guard: InflightGuard,
        idle_timeout: Duration,
        keepalive: Option<KeepAlive>,
        first_token: Option<(FirstToken, std::time::Instant)>,
        on_done: OnDone,
    ) -> Self {
        Self {
            inner,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            keepalive,
            scanner: UsageScanner::default(),
            first_token,
            guard: Some(guard),
            on_done: Some(on_done),
            transcript: None,
            kept: 0,
            decision: None,
        }
    }

    /// Tell `decision` (the console's record) when the first token came.
    pub fn with_decision(
        mut self,
        decision: std::sync::Arc<crate::telemetry::live::Decision>,
    ) -> Self {
        self.decision = Some(decision);
        self
    }

    /// Keep the chunks that pass (refcounted, not copied), up to 16 MiB, for
    /// `on_done` to count completion tokens from after the stream ended.
    pub fn keep_transcript(mut self) -> Self {
        self.transcript = Some(Vec::new());
        self
    }
}

#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeout(Duration);

impl<S, E> Stream for UpstreamBody<S>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<BoxError>,
{
    type Item = Result<Bytes, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        match this.inner.poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(g) = this.guard.as_mut() {
                    g.first_byte();
                }
                this.scanner.feed(&chunk);
                if let Some(t) = this.transcript.as_mut()
                    && *this.kept + chunk.len() <= TRANSCRIPT_LIMIT
                {
                    *this.kept += chunk.len();
                    t.push(chunk.clone());
                }
                if let (Some((probe, since)), Some(g)) =
                    (this.first_token.as_mut(), this.guard.as_mut())
                    && probe.feed(&chunk, std::time::Instant::now())
                {
                    g.first_token();
                    let took = since.elapsed();
                    g.instance().series.first_token(took);
                    if let Some(d) = this.decision.as_ref() {
                        d.first_token(took);
                    }
                }
                this.idle
                    .as_mut()
                    .reset(Instant::now() + *this.idle_timeout);
                if let Some(k) = this.keepalive.as_mut() {
                    k.saw(&chunk);
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.guard.take();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                if let (Some((probe, _)), Some(g)) =
                    (this.first_token.as_ref(), this.guard.as_ref())
                    && let Some(gap) = probe.gap()
                {
                    g.instance().pace.observe_gap(gap.as_secs_f64());
                }
                if let Some(g) = this.guard.as_mut() {
                    g.answered(this.scanner.usage().map(|u| u.prompt_tokens));
                }
                // Release the slot the moment the upstream is done, not when
                // hyper gets round to dropping the body.
                if let Some(done) = this.on_done.take() {
                    done(this.scanner.usage(), this.transcript.take());
                }
                this.guard.take();
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.idle.poll(cx).is_ready() {
                    this.guard.take();
                    return Poll::Ready(Some(Err(Box::new(IdleTimeout(*this.idle_timeout)))));
                }
                if let Some(k) = this.keepalive.as_mut()
                    && k.timer.as_mut().poll(cx).is_ready()
                {
                    let ping = k.between_events();
                    let every = k.every;
                    k.timer.as_mut().reset(Instant::now() + every);
                    // Register the new deadline with the waker.
                    let _ = k.timer.as_mut().poll(cx);
                    if ping {
                        return Poll::Ready(Some(Ok(Bytes::from_static(PING))));
                    }
                }
                Poll::Pending
            }
        }
    }
}
