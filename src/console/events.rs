//! `GET /console/api/events`: the console's Server-Sent Events. One sampler
//! task, started by the first viewer and ended after the last, builds the
//! fleet-and-tenants snapshot once a second and publishes it on a `watch`
//! channel: ten viewers cost what one does, and none of them touches the
//! request path (the snapshot reads atomics; the decision ring is read
//! lock-free by each viewer from its own cursor). With nobody watching,
//! no task runs at all.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::fleet::AppState;

/// Between two samples.
pub const EVERY: Duration = Duration::from_secs(1);
/// Most decisions a viewer is sent in one event.
const MAX_DECISIONS: usize = 300;

/// The sampler's channel, and whether it runs.
#[derive(Debug)]
pub struct Hub {
    tx: watch::Sender<Arc<str>>,
    running: AtomicBool,
}

impl Default for Hub {
    fn default() -> Self {
        Self {
            tx: watch::Sender::new(Arc::from("{}")),
            running: AtomicBool::new(false),
        }
    }
}

impl Hub {
    /// A receiver of samples; starts the sampler if it is not running.
    fn subscribe(self: &Arc<Self>, state: &Arc<AppState>) -> watch::Receiver<Arc<str>> {
        let rx = self.tx.subscribe();
        if !self.running.swap(true, Ordering::AcqRel) {
            tokio::spawn(sample(Arc::clone(self), Arc::downgrade(state)));
        }
        rx
    }
}

/// Sample while anyone watches.
async fn sample(hub: Arc<Hub>, state: Weak<AppState>) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        let Some(live) = state.upgrade() else { break };
        if live.shutting_down.load(Ordering::Relaxed) {
            // Wake every viewer: each sees the shutdown and ends its stream,
            // so none holds up the graceful shutdown.
            hub.running.store(false, Ordering::Release);
            hub.tx.send_replace(Arc::from("{}"));
            break;
        }
        if hub.tx.receiver_count() == 0 {
            hub.running.store(false, Ordering::Release);
            // A viewer that came between the count and the store found it
            // running and started nothing: keep going for it.
            if hub.tx.receiver_count() == 0 || hub.running.swap(true, Ordering::AcqRel) {
                break;
            }
        }
        let snapshot = super::snapshot::snapshot(&live.runtime.load());
        hub.tx.send_replace(Arc::from(snapshot.to_string()));
    }
}

/// The whole picture a viewer starts from: the snapshot, the last
/// decisions, where the decision ring stands, and the last reload.
pub fn full(state: &AppState) -> (Value, u64) {
    let rt = state.runtime.load();
    let (decisions, next) = rt.live.decisions.since(0, MAX_DECISIONS);
    let lines: Vec<Value> = decisions
        .iter()
        .map(|d| super::decisions::line(&rt, d))
        .collect();
    let reload = rt.live.last_reload();
    let v = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "started_ms": rt.live.started_ms,
        "reload": {"at_ms": reload.at_ms, "by": reload.by, "count": reload.count},
        "state": super::snapshot::snapshot(&rt),
        "decisions": lines,
        "next_seq": next,
    });
    (v, next)
}

/// The stream: `hello` with [`full`], then a `state` sample and the new
/// `decisions` each second; it ends when the gateway shuts down.
pub async fn stream(
    State(state): State<Arc<AppState>>,
    Extension(hub): Extension<Arc<Hub>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = hub.subscribe(&state);
    let (hello, cursor) = full(&state);
    let first = Event::default().event("hello").data(hello.to_string());
    let events = futures_util::stream::unfold(
        (
            Some(first),
            rx,
            cursor,
            Arc::downgrade(&state),
            Vec::<Event>::new(),
        ),
        |(first, mut rx, mut cursor, state, mut pending)| async move {
            if let Some(e) = first {
                return Some((Ok(e), (None, rx, cursor, state, pending)));
            }
            loop {
                if let Some(e) = pending.pop() {
                    return Some((Ok(e), (None, rx, cursor, state, pending)));
                }
                rx.changed().await.ok()?;
                let live = state.upgrade()?;
                if live.shutting_down.load(Ordering::Relaxed) {
                    return None;
                }
                let sample = Arc::clone(&rx.borrow_and_update());
                let rt = live.runtime.load();
                let (new, next) = rt.live.decisions.since(cursor, MAX_DECISIONS);
                cursor = next;
                // Popped from the back: decisions go out after the state.
                if !new.is_empty() {
                    let lines: Vec<Value> =
                        new.iter().map(|d| super::decisions::line(&rt, d)).collect();
                    pending.push(
                        Event::default()
                            .event("decisions")
                            .data(Value::Array(lines).to_string()),
                    );
                }
                pending.push(Event::default().event("state").data(&*sample));
            }
        },
    );
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
