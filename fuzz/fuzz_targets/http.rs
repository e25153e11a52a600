//! Arbitrary bytes from a client, into the same connection code the accept
//! loop runs (`kvgate::server::conn::serve`: the guard, hyper HTTP/1 and HTTP/2, the
//! whole router), over an in-memory stream. The client sends the bytes and
//! closes its side. Must never panic; the gateway must close the connection
//! (time is paused, so its timeouts pass at once); and every HTTP/1 error it
//! writes must be in the error shape (JSON) — nothing from hyper's canned
//! empty-body answers. The one upstream refuses connections.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONFIG: &str = "server:
  timeouts: { connect_ms: 100, first_byte_ms: 1000, header_read_ms: 1000, body_read_ms: 1000, client_idle_ms: 1000 }
  max_body_bytes: 65536
endpoints:
  - name: chat
    models: [\"m\"]
    instances: [{ url: \"http://127.0.0.1:9\" }]
";

struct World {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
    builder: Arc<kvgate::server::conn::ConnBuilder>,
    limits: kvgate::server::conn::Limits,
    stop: tokio::sync::watch::Receiver<bool>,
    _stop_tx: tokio::sync::watch::Sender<bool>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let config = kvgate::Config::from_yaml(CONFIG).unwrap();
        let limits = kvgate::server::conn::Limits::of(&config.server);
        let builder = Arc::new(kvgate::server::conn::builder(&config.server, Default::default()));
        let app = rt.block_on(async {
            let state = kvgate::build_state(config).unwrap();
            kvgate::api::router(state)
        });
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        World {
            rt,
            app,
            builder,
            limits,
            stop,
            _stop_tx: stop_tx,
        }
    })
}

/// Every HTTP/1 response in `out`, in order, until one whose length is not
/// given: errors must be JSON.
fn check(out: &[u8]) {
    let mut at = 0;
    while out[at..].starts_with(b"HTTP/1.") {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let Ok(httparse::Status::Complete(n)) = resp.parse(&out[at..]) else {
            panic!(
                "unparsable response: {:?}",
                String::from_utf8_lossy(&out[at..])
            );
        };
        let status = resp.code.unwrap_or(0);
        let header = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        if status >= 400 {
            assert_eq!(
                header("content-type").as_deref(),
                Some("application/json"),
                "a {status} outside the error shape: {:?}",
                String::from_utf8_lossy(&out[at..])
            );
        }
        let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) else {
            return;
        };
        at += n + len;
        if status == 100 {
            at -= len;
        }
        if at >= out.len() {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    w.rt.block_on(async {
        let (client, server) = tokio::io::duplex(1 << 16);
        let serve = tokio::spawn(kvgate::server::conn::serve(
            server,
            Arc::clone(&w.builder),
            w.app.clone(),
            w.stop.clone(),
            w.limits,
        ));
        let (mut rd, mut wr) = tokio::io::split(client);
        let data = data.to_vec();
        let writer = tokio::spawn(async move {
            let _ = wr.write_all(&data).await;
            let _ = wr.shutdown().await;
        });
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(120), rd.read_to_end(&mut out)).await;
        writer.abort();
        serve.abort();
        assert!(read.is_ok(), "the gateway never closed the connection");
        check(&out);
    });
});
