//! The publisher task: numbers each batch, sends it on the PUB socket as
//! `[topic, seq (8 bytes BE), payload]`, keeps the last `replay_buffer` batches,
//! and answers replay requests on the ROUTER socket as vLLM does: for
//! `[identity, "", start_seq]`, every buffered batch with `seq >= start_seq` as
//! `[identity, "", topic, seq, payload]`, then `[identity, "", "", 0xFF×8, ""]`
//! (vLLM 0.32's `_service_replay`, checked against the real engine).

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::encode::{self, Wire};
use super::{KvEventsConfig, PubMsg};

/// vLLM's `END_SEQ`: `(-1).to_bytes(8, "big", signed=True)`.
const END_SEQ: [u8; 8] = [0xFF; 8];

/// Where a subscriber connects: `tcp://127.0.0.1:PORT` each.
#[derive(Clone, Debug)]
pub(crate) struct Endpoints {
    pub events: String,
    pub replay: String,
}

/// Bind the PUB and ROUTER sockets on ephemeral loopback ports and spawn the task
/// that serves them; it ends when every sender of `rx` is gone.
pub(crate) async fn bind(
    cfg: &KvEventsConfig,
    wire: Wire,
    rx: mpsc::UnboundedReceiver<PubMsg>,
) -> io::Result<Endpoints> {
    let mut publisher = PubSocket::new();
    let events = publisher
        .bind("tcp://127.0.0.1:0")
        .await
        .map_err(io::Error::other)?;
    let mut router = RouterSocket::new();
    let replay = router
        .bind("tcp://127.0.0.1:0")
        .await
        .map_err(io::Error::other)?;
    let task = Publisher {
        wire,
        topic: Bytes::from(cfg.topic.clone().into_bytes()),
        capacity: cfg.replay_buffer,
        buffer: VecDeque::new(),
        next_seq: 0,
    };
    tokio::spawn(task.run(publisher, router, rx));
    Ok(Endpoints {
        events: events.to_string(),
        replay: replay.to_string(),
    })
}

struct Publisher {
    wire: Wire,
    topic: Bytes,
    capacity: usize,
    /// `(seq, payload)`, oldest first.
    buffer: VecDeque<(u64, Bytes)>,
    next_seq: u64,
}

impl Publisher {
    async fn run(
        mut self,
        mut publisher: PubSocket,
        mut router: RouterSocket,
        mut rx: mpsc::UnboundedReceiver<PubMsg>,
    ) {
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    None => return,
                    Some(PubMsg::Batch { ts, events, send }) => {
                        let Ok(payload) = encode::batch(&self.wire, ts, &events) else {
                            continue;
                        };
                        self.batch(&mut publisher, Bytes::from(payload), send).await;
                    }
                    Some(PubMsg::Restart(ack)) => {
                        self.next_seq = 0;
                        self.buffer.clear();
                        let _ = ack.send(());
                    }
                },
                request = router.recv() => match request {
                    Ok(request) => self.replay(&mut router, request).await,
                    // Not expected while the socket lives; do not spin if it happens.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                },
            }
        }
    }

    async fn batch(&mut self, publisher: &mut PubSocket, payload: Bytes, send: bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.capacity > 0 {
            if self.buffer.len() == self.capacity {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload.clone()));
        }
        if send {
            let frames = vec![self.topic.clone(), seq_frame(seq), payload];
            if let Ok(msg) = ZmqMessage::try_from(frames) {
                // PUB never blocks: a subscriber that cannot keep up loses messages,
                // which it sees as a seq gap and repairs by replay.
                let _ = publisher.send(msg).await;
            }
        }
    }

    async fn replay(&self, router: &mut RouterSocket, request: ZmqMessage) {
        let frames = request.into_vec();
        let [identity, _empty, start] = frames.as_slice() else {
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            return;
        };
        let start = u64::from_be_bytes(start);
        let reply = |topic: Bytes, seq: Bytes, payload: Bytes| {
            ZmqMessage::try_from(vec![identity.clone(), Bytes::new(), topic, seq, payload])
        };
        for (seq, payload) in self.buffer.iter().filter(|(seq, _)| *seq >= start) {
            let Ok(msg) = reply(self.topic.clone(), seq_frame(*seq), payload.clone()) else {
                return;
            };
            if router.send(msg).await.is_err() {
                return; // the client went away
            }
        }
        if let Ok(msg) = reply(Bytes::new(), Bytes::from_static(&END_SEQ), Bytes::new()) {
            let _ = router.send(msg).await;
        }
    }
}

fn seq_frame(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}
