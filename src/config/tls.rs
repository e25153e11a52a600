//! `upstream.tls`: what the upstream clients trust for `https://` instances.
//! Both (the proxy path's, [`super::client`], and reqwest for health checks,
//! capacity probes and warm-up) speak TLS through rustls; by default it trusts the system's roots (the platform
//! verifier: `/etc/ssl/certs` and friends on Linux), and `ca_file` adds a PEM
//! bundle (a private CA) to them, or with `system_roots: false` replaces them.
//!
//! ```yaml
//! upstream:
//!   tls: { ca_file: /etc/kvgate/upstream-ca.pem, system_roots: true }
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

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
    /// The same certificates for the proxy path's rustls config.
    der: Vec<CertificateDer<'static>>,
}

impl Default for UpstreamTls {
    fn default() -> Self {
        Self {
            ca_file: None,
            system_roots: true,
            certs: Vec::new(),
            der: Vec::new(),
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
    let not_pem = |e: &dyn std::fmt::Display| {
        ConfigError::new(at, format!("{path:?} is not a PEM bundle: {e}"))
    };
    let der = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(&e))?;
    if der.is_empty() {
        return Err(ConfigError::new(
            at,
            format!("{path:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    // The same certificates for reqwest (probes, warm-up): parsed once.
    let certs = der
        .iter()
        .map(|d| reqwest::Certificate::from_der(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(&e))?;
    Ok(UpstreamTls {
        ca_file: Some(PathBuf::from(path)),
        system_roots,
        certs,
        der,
    })
}

impl UpstreamTls {
    /// The proxy path's rustls config: the platform verifier with the CA
    /// file's certificates added, or those certificates alone.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, rustls::Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let config = if self.system_roots {
            let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
                self.der.iter().cloned(),
                provider,
            )?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        } else {
            let mut roots = rustls::RootCertStore::empty();
            for cert in &self.der {
                roots
                    .add(cert.clone())
                    .map_err(|e| rustls::Error::General(e.to_string()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        Ok(config)
    }

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
