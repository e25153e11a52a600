//! The engine task: drives one instance's scheduler in tokio time and publishes each
//! sequence's progress to its response through a `watch` channel.
//!
//! The engine keeps a real-time deadline for the end of each step and sleeps until
//! it, so steps shorter than the timer's 1 ms resolution (fast `time_scale`s) run
//! several to a wake-up without the simulation drifting. When the host cannot keep
//! up it runs steps back to back, yielding between them.
//! Channel traffic is kept small: a `watch` holds the latest progress only (a slow
//! reader skips to it and renders the tokens it missed in one write), and
//! non-streaming requests are woken once, when they finish.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::kv_events::KvSink;
use crate::scheduler::{Event, Scheduler, SeqSink, SeqSpec};

/// A request's progress as its response sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    pub cached_tokens: usize,
    pub generated: usize,
    pub done: bool,
    /// The sequence can never fit this instance's KV cache.
    pub rejected: bool,
}

/// Feeds a sequence's events into its response's `watch`; the response dropping
/// its receiver (the client went away) aborts the sequence.
pub(crate) struct EngineSink {
    tx: watch::Sender<Progress>,
    /// Publish every token (streaming) or only the end.
    every_token: bool,
    state: Progress,
}

impl EngineSink {
    pub(crate) fn new(every_token: bool) -> (Self, watch::Receiver<Progress>) {
        let (tx, rx) = watch::channel(Progress::default());
        let sink = Self {
            tx,
            every_token,
            state: Progress::default(),
        };
        (sink, rx)
    }
}

impl SeqSink for EngineSink {
    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    fn event(&mut self, event: Event) {
        match event {
            Event::Admitted { cached_tokens } => self.state.cached_tokens = cached_tokens,
            Event::Tokens { generated, done } => {
                self.state.generated = generated;
                self.state.done = done;
                if self.every_token || done {
                    self.tx.send_replace(self.state);
                }
            }
            Event::Rejected => {
                self.state.rejected = true;
                self.tx.send_replace(self.state);
            }
        }
    }
}

/// A request handed to the engine.
pub(crate) struct Submission {
    pub spec: SeqSpec,
    pub sink: EngineSink,
    pub arrived: Instant,
}

/// What the engine's inbox carries.
pub(crate) enum Inbox {
    Submit(Submission),
    /// Look like a restarted vLLM to KV-event subscribers (see `SimServer`).
    RestartKv(oneshot::Sender<()>),
}

/// Run until every sender is gone and the last sequence has finished. Each step's
/// KV events go to `kv` as one batch.
pub(crate) async fn run(
    mut sched: Scheduler<EngineSink>,
    mut rx: mpsc::UnboundedReceiver<Inbox>,
    time_scale: f64,
    kv: Option<KvSink>,
) {
    // The real instant at which the simulated clock reads `sched.now()`.
    let mut clock = Instant::now();
    let mut last_step = Duration::ZERO;
    loop {
        if sched.is_idle() {
            let Some(msg) = rx.recv().await else {
                return;
            };
            (clock, last_step) = (Instant::now(), Duration::ZERO);
            match msg {
                Inbox::Submit(sub) => {
                    let now = sched.now();
                    sched.submit(sub.spec, sub.sink, now);
                }
                Inbox::RestartKv(ack) => restart(&mut sched, kv.as_ref(), ack),
            }
        }
        while let Ok(msg) = rx.try_recv() {
            match msg {
                Inbox::Submit(sub) => {
                    let at = arrival(sched.now(), clock, last_step, sub.arrived, time_scale);
                    sched.submit(sub.spec, sub.sink, at);
                }
                Inbox::RestartKv(ack) => restart(&mut sched, kv.as_ref(), ack),
            }
        }
        let Some(step) = sched.plan() else {
            flush(&mut sched, kv.as_ref());
            continue;
        };
        clock = clock.checked_add(scaled(step, time_scale)).unwrap_or(clock);
        if clock > Instant::now() {
            tokio::time::sleep_until(clock).await;
        } else {
            tokio::task::yield_now().await;
        }
        sched.finish(step);
        flush(&mut sched, kv.as_ref());
        last_step = step;
    }
}

fn flush(sched: &mut Scheduler<EngineSink>, kv: Option<&KvSink>) {
    if let Some(kv) = kv {
        kv.publish(sched.take_kv_events());
    }
}

fn restart(sched: &mut Scheduler<EngineSink>, kv: Option<&KvSink>, ack: oneshot::Sender<()>) {
    sched.forget_cache();
    match kv {
        Some(kv) => kv.restart(ack),
        None => {
            let _ = ack.send(());
        }
    }
}

/// Real duration of a simulated one.
fn scaled(simulated: Duration, time_scale: f64) -> Duration {
    Duration::try_from_secs_f64(simulated.as_secs_f64() * time_scale).unwrap_or(Duration::ZERO)
}

/// Simulated arrival time of a request that reached the engine during the last step
/// (it drains new requests between steps): its TTFT includes the rest of that step.
fn arrival(
    now: Duration,
    clock: Instant,
    last_step: Duration,
    arrived: Instant,
    time_scale: f64,
) -> Duration {
    let waited = clock.saturating_duration_since(arrived).as_secs_f64();
    let waited = if time_scale > 0.0 {
        Duration::try_from_secs_f64(waited / time_scale).unwrap_or(last_step)
    } else {
        Duration::ZERO
    };
    now.saturating_sub(waited.min(last_step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_maps_real_wait_into_the_last_step() {
        let clock = Instant::now();
        let now = Duration::from_secs(10);
        let step = Duration::from_secs(1);
        let before = |ms| clock - Duration::from_millis(ms);
        // 5 ms real at 1/100 speed = 0.5 s simulated before the step ended.
        assert_eq!(
            arrival(now, clock, step, before(5), 0.01),
            Duration::from_millis(9_500)
        );
        // Never earlier than the step's start.
        assert_eq!(
            arrival(now, clock, step, before(50), 0.01),
            Duration::from_secs(9)
        );
        // Arrived after the engine's (lagging) clock: now.
        assert_eq!(
            arrival(now, clock, step, clock + Duration::from_millis(1), 1.0),
            now
        );
        assert_eq!(arrival(now, clock, step, before(5), 0.0), now);
    }

    #[test]
    fn scaled_multiplies_and_never_panics() {
        assert_eq!(scaled(Duration::from_secs(2), 0.5), Duration::from_secs(1));
        assert_eq!(scaled(Duration::from_secs(2), 0.0), Duration::ZERO);
        assert_eq!(scaled(Duration::MAX, 1_000.0), Duration::ZERO);
    }

    #[test]
    fn sink_publishes_every_token_only_when_streaming() {
        let (mut stream, rx_s) = EngineSink::new(true);
        let (mut whole, rx_w) = EngineSink::new(false);
        for sink in [&mut stream, &mut whole] {
            sink.event(Event::Admitted { cached_tokens: 32 });
            sink.event(Event::Tokens {
                generated: 1,
                done: false,
            });
        }
        assert_eq!(rx_s.borrow().generated, 1);
        assert_eq!(rx_s.borrow().cached_tokens, 32);
        assert_eq!(*rx_w.borrow(), Progress::default());
        whole.event(Event::Tokens {
            generated: 2,
            done: true,
        });
        assert!(rx_w.borrow().done);
        drop(rx_w);
        assert!(whole.is_closed() && !stream.is_closed());
    }
}
