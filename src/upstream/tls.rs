//! `upstream.tls`: what the upstream client trusts for `https://` instances.
//! The one client (requests, health checks, capacity probes, warm-up) speaks
//! TLS through rustls; by default it trusts the system's roots (the platform
//! verifier: `/etc/ssl/certs` and friends on Linux), and `ca_file` adds a PEM
//! bundle (a private CA) to them, or with `system_roots: false` replaces them.
//!
//! ```yaml
//! upstream:
//!   tls: { ca_file: /etc/kvgate/upstream-ca.pem, system_roots: true }
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub tls: Option<RawTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// PEM file of CA certificates to trust for instances.
    pub ca_file: Option<String>,
    /// Trust the system's roots too (default true).
    pub system_roots: Option<bool>,
}

/// Validated trust settings, with the CA file's certificates read.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    pub ca_file: Option<PathBuf>,
    pub system_roots: bool,
    certs: Vec<reqwest::Certificate>,
}

impl Default for UpstreamTls {
    fn default() -> Self {
        Self {
            ca_file: None,
            system_roots: true,
            certs: Vec::new(),
        }
    }
}

/// Validate `upstream`: the CA file is read now, so `check` and a reload
/// refuse a missing or empty one instead of the first request failing.
pub fn validate(raw: RawUpstream) -> Result<UpstreamTls, ConfigError> {
    let Some(tls) = raw.tls else {
        return Ok(UpstreamTls::default());
    };
    let system_roots = tls.system_roots.unwrap_or(true);
    let Some(path) = tls.ca_file else {
        if !system_roots {
            return Err(ConfigError::new(
                "upstream.tls.system_roots",
                "is false without a ca_file: no https:// instance could be trusted",
            ));
        }
        return Ok(UpstreamTls::default());
    };
    let at = "upstream.tls.ca_file";
    let pem = std::fs::read(&path)
        .map_err(|e| ConfigError::new(at, format!("cannot read {path:?}: {e}")))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| ConfigError::new(at, format!("{path:?} is not a PEM bundle: {e}")))?;
    if certs.is_empty() {
        return Err(ConfigError::new(
            at,
            format!("{path:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    Ok(UpstreamTls {
        ca_file: Some(PathBuf::from(path)),
        system_roots,
        certs,
    })
}

impl UpstreamTls {
    /// The client builder with these roots, over rustls.
    pub fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let builder = builder.tls_backend_rustls();
        match (self.certs.is_empty(), self.system_roots) {
            (true, _) => builder,
            (false, true) => builder.tls_certs_merge(self.certs.iter().cloned()),
            (false, false) => builder.tls_certs_only(self.certs.iter().cloned()),
        }
    }
}
