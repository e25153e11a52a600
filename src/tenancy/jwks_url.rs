//! A JWKS fetched from a URL (an OIDC provider's `jwks_uri`) and kept fresh:
//! refetched every `jwks_refresh_s`, and early when a token names a key id
//! the set lacks (the provider rotated its keys), at most once per
//! [`MIN_REFETCH`]. A failed fetch keeps the last good set. There is one
//! fetcher per (URL, key family, interval) in the process, so a config
//! reload keeps the keys already fetched instead of starting empty.
//! [`key_set`] reads a JWKS document, fetched here or from `jwks_file`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{JwkSet, PublicKeyUse};
use jsonwebtoken::{AlgorithmFamily, DecodingKey};

/// Tokens with unknown key ids must not turn into a fetch each.
const MIN_REFETCH: Duration = Duration::from_secs(10);
/// After a failed fetch with no keys at all, try again soon.
const RETRY_EMPTY: Duration = Duration::from_secs(1);

pub type KeySet = Vec<(Option<String>, DecodingKey)>;

pub struct RemoteJwks {
    pub url: String,
    family: AlgorithmFamily,
    refresh: Duration,
    keys: ArcSwap<KeySet>,
    wake: tokio::sync::Notify,
    started: AtomicBool,
}

impl std::fmt::Debug for RemoteJwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteJwks")
            .field("url", &self.url)
            .field("keys", &self.keys.load().len())
            .finish_non_exhaustive()
    }
}

static FETCHERS: Mutex<Vec<Weak<RemoteJwks>>> = Mutex::new(Vec::new());

/// The process's fetcher for this URL, family and interval (a new one if
/// none is alive).
pub fn shared(url: &str, family: AlgorithmFamily, refresh: Duration) -> Arc<RemoteJwks> {
    let mut all = FETCHERS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    if let Some(live) = all
        .iter()
        .filter_map(Weak::upgrade)
        .find(|r| r.url == url && r.family == family && r.refresh == refresh)
    {
        return live;
    }
    let r = Arc::new(RemoteJwks {
        url: url.to_owned(),
        family,
        refresh,
        keys: ArcSwap::from_pointee(Vec::new()),
        wake: tokio::sync::Notify::new(),
        started: AtomicBool::new(false),
    });
    all.push(Arc::downgrade(&r));
    r
}

impl RemoteJwks {
    pub fn keys(&self) -> Arc<KeySet> {
        self.keys.load_full()
    }

    /// A token named a key id the set lacks: refetch soon.
    pub fn missing_kid(&self) {
        self.wake.notify_one();
    }

    /// Start fetching (once), on the current Tokio runtime; without one
    /// (`kvgate check`) nothing is fetched.
    pub fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(refresh(Arc::downgrade(self)));
            }
            Err(_) => self.started.store(false, Ordering::SeqCst),
        }
    }
}

/// Fetch now, then on the interval or when woken, until the fetcher is dropped.
async fn refresh(me: Weak<RemoteJwks>) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the JWKS client");
            return;
        }
    };
    loop {
        let Some(r) = me.upgrade() else { return };
        let fetched = fetch(&client, &r.url, r.family).await;
        let ok = fetched.is_ok();
        match fetched {
            Ok(keys) => {
                let changed = kids(&r.keys.load()) != kids(&keys);
                if changed {
                    tracing::info!(url = %r.url, keys = keys.len(), "JWKS loaded");
                }
                r.keys.store(Arc::new(keys));
            }
            Err(e) => {
                tracing::warn!(url = %r.url, error = %e, "JWKS fetch failed; keeping the last key set");
            }
        }
        crate::telemetry::jwks_refresh(ok);
        let wait = if !ok && r.keys.load().is_empty() {
            RETRY_EMPTY
        } else {
            r.refresh
        };
        drop(r);
        let fetched_at = Instant::now();
        // Wait for the interval or a wake-up, re-checking each second that
        // the fetcher is still wanted; a wake-up counts after MIN_REFETCH.
        loop {
            let Some(r) = me.upgrade() else { return };
            let woken = tokio::time::timeout(Duration::from_secs(1), r.wake.notified())
                .await
                .is_ok();
            drop(r);
            let since = fetched_at.elapsed();
            if since >= wait {
                break;
            }
            if woken {
                tokio::time::sleep(MIN_REFETCH.saturating_sub(since)).await;
                break;
            }
        }
    }
}

async fn fetch(
    client: &reqwest::Client,
    url: &str,
    family: AlgorithmFamily,
) -> Result<KeySet, String> {
    let resp = client.get(url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    let text = resp.text().await.map_err(|e| e.to_string())?;
    key_set(&text, family)
}

/// Signing keys of the configured family; encryption keys and keys of other
/// types are skipped, as identity providers publish those side by side.
pub(super) fn key_set(text: &str, family: AlgorithmFamily) -> Result<KeySet, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption))
            || !jwk.is_supported()
        {
            continue;
        }
        let key =
            DecodingKey::from_jwk(jwk).map_err(|e| format!("key {:?}: {e}", jwk.common.key_id))?;
        if key.family() == family {
            keys.push((jwk.common.key_id.clone(), key));
        }
    }
    if keys.is_empty() {
        return Err("no signing key of the configured algorithm family".into());
    }
    Ok(keys)
}

fn kids(keys: &KeySet) -> Vec<Option<&str>> {
    keys.iter().map(|(k, _)| k.as_deref()).collect()
}
