//! [`Secret`]: a configured secret (an HMAC key, a salt, a token), written
//! inline or read from an environment variable or a file, and kept out of logs.

use serde::Deserialize;

/// A configured secret, kept out of `Debug` output and so out of logs.
///
/// In YAML it is either the value itself or where to find it, read when the
/// config is loaded (and so again on every reload):
/// `{ env: KVGATE_JWT_SECRET }` (an environment variable) or
/// `{ file: /var/run/secrets/kvgate/jwt }` (a file, such as a mounted
/// Kubernetes Secret; one trailing newline is dropped).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SecretSource")]
pub struct Secret(String);

/// Where a [`Secret`] comes from, as written in the config.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a secret: a string, { env: NAME } or { file: PATH }"
)]
enum SecretSource {
    Inline(String),
    From(SecretRef),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
enum SecretRef {
    Env(String),
    File(std::path::PathBuf),
}

impl TryFrom<SecretSource> for Secret {
    type Error = String;

    fn try_from(source: SecretSource) -> Result<Self, String> {
        let value = match source {
            SecretSource::Inline(s) => return Ok(Secret(s)),
            SecretSource::From(SecretRef::Env(name)) => std::env::var(&name).map_err(|_| {
                format!("secret from environment variable {name}: not set (or not UTF-8)")
            })?,
            SecretSource::From(SecretRef::File(path)) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("secret from file {}: {e}", path.display()))?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                text.strip_suffix('\r').unwrap_or(text).to_owned()
            }
        };
        if value.is_empty() {
            return Err("secret from the environment or a file is empty".to_owned());
        }
        Ok(Secret(value))
    }
}

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}
