//! The round every `cluster.sync_ms` that shares this replica's figures and
//! placements and takes in the others' (see [`super`]). One Redis pipeline
//! a round; a round that returned a full page of the routed stream is
//! followed at once by the next, so a starting replica reads the history
//! before it waits. Never on the request path.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::{Duration, Instant};

use super::wire::{self, EndpointFigures, Snapshot};
use super::{Figures, Peers, STALE};
use crate::fleet::{AppState, Runtime};
use crate::telemetry;

/// Stream entries read a round at most.
const PAGE: usize = 1024;
/// The `peers` hash lives this long after the last replica wrote to it.
const HASH_TTL_MS: u64 = 60_000;
/// A replica silent this long is taken out of the hash.
const FORGET: Duration = Duration::from_secs(30);

/// Where this replica stands between rounds.
#[derive(Debug)]
struct Cursor {
    /// The last routed entry read ("0": from the beginning).
    last_id: String,
    /// Redis's clock at the last round, and when that was here.
    clock: Option<(u64, Instant)>,
    /// The last round that succeeded.
    last_ok: Option<Instant>,
    started: Instant,
    caught_up: bool,
    /// Fields of replicas gone silent, to remove next round.
    forget: Vec<String>,
}

impl Cursor {
    fn now_ms(&self) -> u64 {
        self.clock.map_or(0, |(ms, at)| {
            ms.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(0))
        })
    }
}

/// Run until the state is dropped by everyone else.
pub async fn run(state: Weak<AppState>) {
    let mut cursor = Cursor {
        last_id: "0".to_owned(),
        clock: None,
        last_ok: None,
        started: Instant::now(),
        caught_up: false,
        forget: Vec::new(),
    };
    loop {
        let Some(live) = state.upgrade() else { return };
        let rt = live.runtime.load_full();
        drop(live);
        let Some(peers) = rt.peers.clone() else {
            drop(rt);
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let more = round(&rt, &peers, &mut cursor).await;
        drop(rt);
        if !more {
            tokio::time::sleep(peers.every).await;
        }
    }
}

/// One round; whether another should follow at once (a full page read).
async fn round(rt: &Runtime, peers: &Peers, cursor: &mut Cursor) -> bool {
    let cluster = &peers.cluster;
    let (hash, stream) = (cluster.prefixed("peers"), cluster.prefixed("routed"));
    let me = cluster.replica_id();
    let outgoing = peers.take_outbox();
    let snapshot = serde_json::to_vec(&own(rt, cursor.now_ms())).unwrap_or_default();
    let mut pipe = redis::pipe();
    pipe.cmd("TIME");
    pipe.cmd("HSET").arg(&hash).arg(me).arg(snapshot);
    pipe.cmd("PEXPIRE").arg(&hash).arg(HASH_TTL_MS);
    pipe.cmd("HGETALL").arg(&hash);
    for gone in cursor.forget.drain(..) {
        pipe.cmd("HDEL").arg(&hash).arg(gone).ignore();
    }
    for r in &outgoing {
        pipe.cmd("XADD")
            .arg(&stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(cluster.config.routed_history)
            .arg("*")
            .arg("r")
            .arg(me)
            .arg("e")
            .arg(&r.endpoint)
            .arg("i")
            .arg(&r.instance)
            .arg("c")
            .arg(wire::chain_bytes(&r.chain))
            .ignore();
    }
    pipe.cmd("XREAD")
        .arg("COUNT")
        .arg(PAGE)
        .arg("STREAMS")
        .arg(&stream)
        .arg(&cursor.last_id);
    let Some(replies) = cluster.pipeline(&pipe).await else {
        metrics::counter!(telemetry::CLUSTER_SYNC, "outcome" => "failed").increment(1);
        let dropped = outgoing.len() as u64;
        metrics::counter!(telemetry::CLUSTER_ROUTED, "direction" => "dropped").increment(dropped);
        // On its own view once the others' figures are too old to believe.
        if cursor.last_ok.is_none_or(|t| t.elapsed() > STALE) {
            apply_figures(rt, &HashMap::new());
            metrics::gauge!(telemetry::CLUSTER_PEERS).set(0.0);
        }
        return false;
    };
    metrics::counter!(telemetry::CLUSTER_SYNC, "outcome" => "ok").increment(1);
    let dropped = peers.dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
    metrics::counter!(telemetry::CLUSTER_ROUTED, "direction" => "sent")
        .increment(outgoing.len() as u64);
    metrics::counter!(telemetry::CLUSTER_ROUTED, "direction" => "dropped").increment(dropped);
    cursor.last_ok = Some(Instant::now());
    let [time, _, _, all, ..] = replies.as_slice() else {
        return false;
    };
    if let Some(ms) = wire::time_ms(time) {
        cursor.clock = Some((ms, Instant::now()));
    }
    let now = cursor.now_ms();
    let mut believed = 0;
    let mut sums: HashMap<String, EndpointSum> = HashMap::new();
    for (field, value) in wire::hash_pairs(all) {
        if field == me {
            continue;
        }
        let Ok(snap) = serde_json::from_slice::<Snapshot>(&value) else {
            continue;
        };
        let age = Duration::from_millis(now.saturating_sub(snap.at));
        if snap.at == 0 || age > STALE {
            if snap.at > 0 && age > FORGET {
                cursor.forget.push(field);
            }
            continue;
        }
        believed += 1;
        for ep in snap.endpoints {
            let sum = sums.entry(ep.name).or_default();
            for (id, f) in ep.instances {
                sum.instances.entry(id).or_default().add(&f);
            }
            for (tenant, s) in ep.service {
                *sum.service.entry(tenant).or_default() += s;
            }
        }
    }
    metrics::gauge!(telemetry::CLUSTER_PEERS).set(f64::from(believed));
    apply_figures(rt, &sums);
    let (entries, last) = replies.last().map(wire::stream_entries).unwrap_or_default();
    let read = entries.len();
    let mut applied = 0u64;
    for e in entries {
        if e.replica == me {
            continue;
        }
        let Some(inst) = rt
            .endpoint(&e.endpoint)
            .and_then(|ep| ep.instances.iter().find(|i| i.id == e.instance))
        else {
            continue;
        };
        let inserted = inst.index.insert(&e.chain);
        // Another replica's request has been answered: what it placed is settled.
        inst.index.settle(inserted.stamp());
        inst.series.index_size(inserted.len);
        applied += 1;
    }
    metrics::counter!(telemetry::CLUSTER_ROUTED, "direction" => "applied").increment(applied);
    if let Some(last) = last {
        cursor.last_id = last;
    }
    let more = read >= PAGE;
    if !more && !cursor.caught_up {
        cursor.caught_up = true;
        let took = cursor.started.elapsed();
        metrics::gauge!(telemetry::CLUSTER_CATCH_UP).set(took.as_secs_f64());
        tracing::info!(
            took_ms = took.as_millis() as u64,
            peers = believed,
            "cluster: caught up with the other replicas' placements"
        );
    }
    more
}

#[derive(Debug, Default)]
struct EndpointSum {
    instances: HashMap<String, Figures>,
    service: HashMap<String, f64>,
}

/// This replica's own figures, stamped `at` (Redis's clock).
fn own(rt: &Runtime, at: u64) -> Snapshot {
    Snapshot {
        at,
        endpoints: rt
            .endpoints
            .iter()
            .map(|ep| EndpointFigures {
                name: ep.name().to_owned(),
                instances: ep
                    .instances
                    .iter()
                    .map(|i| (i.id.clone(), i.own_figures()))
                    .collect(),
                service: ep.queue.own_service(),
            })
            .collect(),
    }
}

/// The others' figures into each instance and fair queue (zero where none).
fn apply_figures(rt: &Runtime, sums: &HashMap<String, EndpointSum>) {
    let none = EndpointSum::default();
    for ep in &rt.endpoints {
        let sum = sums.get(ep.name()).unwrap_or(&none);
        for inst in &ep.instances {
            let f = sum.instances.get(&inst.id).copied().unwrap_or_default();
            inst.peer.set(f);
        }
        ep.queue.set_peer_service(&sum.service);
    }
}
