//! HTTP/2 connections, spoken frame by frame over raw sockets: idle ones are
//! closed after `client_idle_ms` (GOAWAY, then close), a header block that
//! trickles in is cut off after `header_read_ms`, and unanswered pings close
//! the connection. A real client (reqwest, prior knowledge) still gets served.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::framing::gateway_with;
use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const RST_STREAM: u8 = 0x3;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK for `GET http://x/health`: indexed :method GET and :scheme http,
/// literal :path and :authority.
fn get_health() -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x44, 7];
    b.extend_from_slice(b"/health");
    b.extend_from_slice(&[0x41, 1, b'x']);
    b
}

/// The types of the whole frames in `bytes`, the server's side of a connection.
fn frame_kinds(mut bytes: &[u8]) -> Vec<u8> {
    let mut kinds = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        kinds.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    kinds
}

/// Open a connection: preface, empty SETTINGS, `GET /health` on stream 1 if asked.
async fn open(addr: std::net::SocketAddr, get: bool) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    if get {
        hello.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_health()));
    }
    s.write_all(&hello).await.unwrap();
    s
}

/// Frame types the server sent, until it closed (`true`) or 10 s passed.
/// SETTINGS are acknowledged; pings only if `pong`.
async fn frames_until_close(s: TcpStream, pong: bool) -> (Vec<u8>, bool) {
    let (mut rd, mut wr) = s.into_split();
    let mut kinds = Vec::new();
    let read = async {
        let mut head = [0u8; 9];
        loop {
            if rd.read_exact(&mut head).await.is_err() {
                return;
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            if rd.read_exact(&mut payload).await.is_err() {
                return;
            }
            let (kind, flags) = (head[3], head[4]);
            kinds.push(kind);
            let answer = match kind {
                SETTINGS if flags & ACK == 0 => Some(frame(SETTINGS, ACK, 0, &[])),
                PING if flags & ACK == 0 && pong => Some(frame(PING, ACK, 0, &payload)),
                _ => None,
            };
            if let Some(a) = answer {
                let _ = wr.write_all(&a).await;
            }
        }
    };
    let closed = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .is_ok();
    (kinds, closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed_after_client_idle_ms() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(
        &up,
        "  http2_keepalive_ms: 0\n  timeouts: { client_idle_ms: 500 }\n",
    )
    .await;
    // A real HTTP/2 client is served as before.
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = h2
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body(MODEL, "sys", "hi", false)).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let addr = gw.addr;
    let all: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(async move { frames_until_close(open(addr, true).await, true).await })
        })
        .collect();
    for t in all {
        let (kinds, closed) = t.await.unwrap();
        assert!(closed, "an idle HTTP/2 connection stayed open: {kinds:?}");
        assert!(
            kinds.contains(&HEADERS),
            "no answer to GET /health: {kinds:?}"
        );
        assert_eq!(
            kinds.last(),
            Some(&GOAWAY),
            "closed without a GOAWAY: {kinds:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_http2_header_block_is_cut_off_after_header_read_ms() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(
        &up,
        "  http2_keepalive_ms: 0\n  timeouts: { header_read_ms: 500, client_idle_ms: 60000 }\n",
    )
    .await;
    let addr = gw.addr;
    let all: Vec<_> = (0..50)
        .map(|i| {
            tokio::spawn(async move {
                // Half after one answered request, half as their first.
                let after_one = i % 2 == 0;
                let s = open(addr, after_one).await;
                let (mut rd, mut wr) = s.into_split();
                let stream = if after_one { 3 } else { 1 };
                // Two well-formed trickles that then stall (h2 finds nothing
                // wrong with either, and three CONTINUATIONs stay under its
                // CONTINUATION-flood limit): a header block without its
                // END_HEADERS, or half of one HEADERS frame a byte at a time.
                let by_frames = i % 4 < 2;
                let writer = tokio::spawn(async move {
                    let mut sends: Vec<Vec<u8>> = Vec::new();
                    if by_frames {
                        sends.push(frame(HEADERS, END_STREAM, stream, &get_health()));
                        // `x-a: b`, a literal without indexing.
                        let field = [0x00, 3, b'x', b'-', b'a', 1, b'b'];
                        sends.extend((0..3).map(|_| frame(CONTINUATION, 0, stream, &field)));
                    } else {
                        let whole = frame(HEADERS, END_STREAM | END_HEADERS, stream, &get_health());
                        sends.extend(whole[..15].iter().map(|&b| vec![b]));
                    }
                    for piece in sends {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if wr.write_all(&piece).await.is_err() {
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(60)).await;
                });
                let mut out = Vec::new();
                let closed =
                    tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
                writer.abort();
                (closed.is_ok(), after_one, out)
            })
        })
        .collect();
    for t in all {
        let (closed, after_one, out) = t.await.unwrap();
        assert!(
            closed,
            "a trickled header block held its connection (after a request: {after_one})"
        );
        let kinds = frame_kinds(&out);
        // Closed by the header clock, not by h2 finding a protocol error.
        assert!(
            !kinds.contains(&RST_STREAM) && !kinds.contains(&GOAWAY),
            "{kinds:?}"
        );
        // The first request, if any, was answered; the trickled one never was.
        let answers = kinds.iter().filter(|&&k| k == HEADERS).count();
        assert_eq!(answers, usize::from(after_one), "{kinds:?}");
    }
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_http2_ping_closes_the_connection() {
    let up = Upstream::start("u0", Mode::Json).await;
    let gw = gateway_with(
        &up,
        "  http2_keepalive_ms: 300\n  timeouts: { client_idle_ms: 60000 }\n",
    )
    .await;
    let (kinds, closed) = frames_until_close(open(gw.addr, true).await, false).await;
    assert!(kinds.contains(&PING), "no keep-alive ping: {kinds:?}");
    assert!(
        closed,
        "a peer that never answers pings kept its connection: {kinds:?}"
    );
    // One that answers keeps it (until idle, which here is a minute away).
    let s = open(gw.addr, true).await;
    let kept = tokio::time::timeout(Duration::from_secs(2), frames_until_close(s, true)).await;
    assert!(kept.is_err(), "a peer answering pings was disconnected");
}
