//! Config reload on SIGHUP and on file change: read, validate, then swap the
//! whole runtime in one step. An invalid file keeps the old config running,
//! is logged with the field at fault, and counted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::Config;
use crate::state::AppState;
use crate::telemetry;

/// Reload `path` into `state` once. Returns the error text on failure.
pub fn reload_from(path: &Path, state: &AppState) -> Result<(), String> {
    let result = Config::load(path).map_err(|e| e.to_string()).and_then(|cfg| {
        let old = state.runtime.load().config.server.listen;
        if cfg.server.listen != old {
            tracing::warn!(old = %old, new = %cfg.server.listen, "server.listen changes only on restart");
        }
        state.reload(cfg).map_err(|e| format!("cannot build the upstream client: {e}"))
    });
    telemetry::config_reload(result.is_ok());
    match &result {
        Ok(()) => tracing::info!(path = %path.display(), "config reloaded"),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "config reload refused; keeping the running config")
        }
    }
    result
}

/// Watch for SIGHUP and for writes to `path`; reload on either. Runs until
/// the process ends.
pub async fn watch(path: PathBuf, state: Arc<AppState>) {
    let (tx, mut rx) = mpsc::channel::<()>(16);
    // Editors replace files by rename, so watch the directory and filter by name.
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    let name = path.file_name().map(|n| n.to_owned());
    let file_tx = tx.clone();
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && (ev.kind.is_modify() || ev.kind.is_create())
            && ev.paths.iter().any(|p| p.file_name() == name.as_deref())
        {
            let _ = file_tx.try_send(());
        }
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
                let _ = tx.send(()).await;
            }
        });
    }
    while rx.recv().await.is_some() {
        // Let a burst of write events (truncate, write, close) settle into one reload.
        tokio::time::sleep(Duration::from_millis(150)).await;
        while rx.try_recv().is_ok() {}
        let _ = reload_from(&path, &state);
    }
}
