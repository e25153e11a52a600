//! Config reload on SIGHUP and on file change: read, validate, then swap the
//! whole runtime in one step. An invalid file keeps the old config running,
//! is logged with the field at fault, and counted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::fleet::AppState;
use crate::telemetry;

/// Reload `path` into `state` once. Returns the error text on failure.
pub fn reload_from(path: &Path, state: &AppState) -> Result<(), String> {
    reload_by(path, state, "file")
}

/// [`reload_from`], noting for the console what asked for it (`file`,
/// `SIGHUP`, `ConfigMap`).
pub fn reload_by(path: &Path, state: &AppState, by: &str) -> Result<(), String> {
    let result = Config::load(path).map_err(|e| e.to_string()).and_then(|mut cfg| {
        let (listen, workers) = {
            let rt = state.runtime.load();
            (rt.config.server.listen, rt.config.server.workers)
        };
        if cfg.server.listen != listen {
            tracing::warn!(old = %listen, new = %cfg.server.listen, "server.listen changes only on restart");
        }
        if cfg.server.workers != workers {
            tracing::warn!(old = workers, new = cfg.server.workers, "server.workers changes only on restart");
            // One upstream pool per running worker, as the server started them.
            cfg.server.workers = workers;
        }
        state.reload(cfg).map_err(|e| format!("cannot build the upstream client: {e}"))
    });
    telemetry::config_reload(result.is_ok());
    if result.is_ok() {
        state.runtime.load().live.reloaded(by);
    }
    match &result {
        Ok(()) => tracing::info!(path = %path.display(), "config reloaded"),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "config reload refused; keeping the running config")
        }
    }
    result
}

/// Watch for SIGHUP and for changes to `path`; reload on either. Runs until
/// the process ends.
///
/// Two kinds of change reach the file. Editors replace it by rename, so the
/// directory is watched and events naming the file reload. Kubernetes mounts a
/// ConfigMap as `config.yaml -> ..data/config.yaml` and updates it by swapping
/// the `..data` symlink to a new timestamped directory: no event names the
/// file, so any other event in the directory reloads when the file now
/// resolves to a different target.
pub async fn watch(path: PathBuf, state: Arc<AppState>) {
    let (tx, mut rx) = mpsc::channel::<Change>(16);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    let name = path.file_name().map(|n| n.to_owned());
    let file_tx = tx.clone();
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        if ev.kind.is_access() {
            return;
        }
        let change = if ev.paths.iter().any(|p| p.file_name() == name.as_deref()) {
            Change::Named
        } else {
            Change::Elsewhere
        };
        let _ = file_tx.try_send(change);
    });
    let _watcher = match watcher {
        Ok(mut w) => match w.watch(&dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the config file; reload with SIGHUP");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the config file; reload with SIGHUP");
            None
        }
    };
    #[cfg(unix)]
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        let tx = tx.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = tx.send(Change::Signal).await;
            }
        });
    }
    let mut target = std::fs::canonicalize(&path).ok();
    while let Some(first) = rx.recv().await {
        // Let a burst of events (truncate, write, close; a symlink swap's
        // create, rename and delete) settle into one reload.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut named = first != Change::Elsewhere;
        let mut signal = first == Change::Signal;
        while let Ok(more) = rx.try_recv() {
            named |= more != Change::Elsewhere;
            signal |= more == Change::Signal;
        }
        let now = std::fs::canonicalize(&path).ok();
        if named || now != target {
            // A swapped `..data` symlink is how a ConfigMap volume changes.
            let by = match (signal, named) {
                (true, _) => "SIGHUP",
                (false, true) => "file",
                (false, false) => "ConfigMap",
            };
            target = now;
            let _ = reload_by(&path, &state, by);
        }
    }
}

/// What a file-system event says about the config file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Change {
    /// The event names the file.
    Named,
    /// SIGHUP asked for a reload.
    Signal,
    /// Something else in its directory changed: reload only if the file
    /// now resolves elsewhere (a swapped `..data` symlink).
    Elsewhere,
}
