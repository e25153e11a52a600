//! The memory test: a fresh kvgate (and, with nginx installed, nginx over
//! h2c) in front of the held-open SSE upstream, RSS idle and with N open
//! streams.

use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;

use crate::procs::{self, Proc};
use crate::{configs, streams};

/// RSS of `proc` idle and with each count of open streams through `port`;
/// each count's streams are released before the next.
async fn measure(proc: &Proc, counts: &[usize], release: &watch::Sender<u64>) -> String {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut line = format!("idle {:.1} MiB", mib(proc.rss_kib()));
    for &n in counts {
        let kib = streams::rss_with_streams(proc.port, n, || proc.rss_kib()).await;
        line.push_str(&format!("; {n} open streams {:.1} MiB", mib(kib)));
        release.send_modify(|v| *v += 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    line
}

/// Runs the test and returns its lines for the report.
pub async fn run(
    dir: &Path,
    nginx: Option<&Path>,
    upstream: u16,
    counts: &[usize],
    release: &watch::Sender<u64>,
) -> String {
    let up = format!("http://127.0.0.1:{upstream}");
    let port = procs::free_port();
    let gw = procs::kvgate(
        dir,
        "streams",
        &configs::kvgate(port, &up, "prefix_aware"),
        port,
    );
    let mut out = format!(
        "- kvgate (`prefix_aware`, a fresh process): {}.\n",
        measure(&gw, counts, release).await
    );
    drop(gw);
    if let Some(bin) = nginx {
        let port = procs::free_port();
        let conf = configs::nginx_streams(dir, port, upstream);
        let ng = procs::nginx(bin, dir, "streams", &conf, port);
        out.push_str(&format!(
            "- nginx (one worker, h2c, `proxy_buffering off`): {}.\n",
            measure(&ng, counts, release).await
        ));
    }
    out.push_str(
        "\nStreams are opened over HTTP/2, 100 a connection as an ingress multiplexes them, \
         because this sandbox caps open files at 20,000 and a proxy holds one upstream socket a stream.\n",
    );
    println!("{out}");
    out
}
