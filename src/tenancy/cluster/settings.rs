//! The `cluster` section: raw serde struct and its validation into
//! [`ClusterConfig`].
//!
//! ```yaml
//! cluster:
//!   redis: "redis://redis.kvgate.svc:6379/0"   # or rediss://, redis://:password@host/db
//!   password: "…"           # optional, over the URL's (a Secret)
//!   key_prefix: "kvgate:"   # every key kvgate writes starts with it
//!   replicas: 3             # the share each replica takes while Redis is away, until learned
//!   timeout_ms: 100         # longest a request waits on one Redis call
//!   heartbeat_ms: 1000      # replica count, slot leases, reconnect probes
//!   slot_lease_ms: 10000    # a dead replica's concurrency slots free after this
//!   sync_ms: 50             # how often routing and fair-queue state is shared (0: not shared)
//!   routed_history: 20000   # routed prompts kept for a replica that starts to catch up on
//! ```

use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;
use crate::tenancy::secret::Secret;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    pub redis: Option<Secret>,
    pub password: Option<Secret>,
    pub key_prefix: Option<String>,
    pub replicas: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    pub slot_lease_ms: Option<u64>,
    pub sync_ms: Option<u64>,
    pub routed_history: Option<u64>,
}

pub const DEFAULT_TIMEOUT_MS: u64 = 100;
pub const DEFAULT_HEARTBEAT_MS: u64 = 1000;
pub const DEFAULT_SLOT_LEASE_MS: u64 = 10_000;
pub const DEFAULT_KEY_PREFIX: &str = "kvgate:";
pub const DEFAULT_SYNC_MS: u64 = 50;
pub const DEFAULT_ROUTED_HISTORY: u64 = 20_000;

/// Validated `cluster` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The Redis URL; a secret because it may carry a password.
    pub redis: Secret,
    pub password: Option<Secret>,
    pub key_prefix: String,
    /// Replicas assumed until Redis has been seen counting them.
    pub replicas: u32,
    pub timeout: Duration,
    pub heartbeat: Duration,
    pub slot_lease: Duration,
    /// How often a replica shares its routing and fair-queue state and reads
    /// the others' (`fleet::peers`); `None`: not shared.
    pub sync: Option<Duration>,
    /// Routed prompts the shared stream keeps (about), for a replica that
    /// starts to replay.
    pub routed_history: u64,
}

pub(crate) fn validate(raw: Option<RawCluster>) -> Result<Option<ClusterConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let Some(url) = raw.redis else {
        if raw.password.is_some() || raw.key_prefix.is_some() || raw.replicas.is_some() {
            return Err(ConfigError::new(
                "cluster.redis",
                "required when the cluster section is present",
            ));
        }
        return Ok(None);
    };
    connection_info(&url, raw.password.as_ref())?;
    let ms = |name: &str, v: Option<u64>, default: u64, range: std::ops::RangeInclusive<u64>| {
        let v = v.unwrap_or(default);
        if range.contains(&v) {
            Ok(Duration::from_millis(v))
        } else {
            Err(ConfigError::new(
                format!("cluster.{name}"),
                format!("{v} is outside {}..={}", range.start(), range.end()),
            ))
        }
    };
    let timeout = ms("timeout_ms", raw.timeout_ms, DEFAULT_TIMEOUT_MS, 1..=10_000)?;
    let heartbeat = ms(
        "heartbeat_ms",
        raw.heartbeat_ms,
        DEFAULT_HEARTBEAT_MS,
        50..=60_000,
    )?;
    let slot_lease = ms(
        "slot_lease_ms",
        raw.slot_lease_ms,
        DEFAULT_SLOT_LEASE_MS,
        100..=3_600_000,
    )?;
    // Three heartbeats per lease: one late or lost renewal never frees a
    // live request's slot.
    if slot_lease < heartbeat * 3 {
        return Err(ConfigError::new(
            "cluster.slot_lease_ms",
            "must be at least three heartbeat_ms, so a late renewal never frees a live slot",
        ));
    }
    let sync = match raw.sync_ms.unwrap_or(DEFAULT_SYNC_MS) {
        0 => None,
        v @ 10..=10_000 => Some(Duration::from_millis(v)),
        v => {
            return Err(ConfigError::new(
                "cluster.sync_ms",
                format!("{v} is outside 10..=10000 (0 turns sharing off)"),
            ));
        }
    };
    let routed_history = match raw.routed_history.unwrap_or(DEFAULT_ROUTED_HISTORY) {
        v @ 100..=10_000_000 => v,
        v => {
            return Err(ConfigError::new(
                "cluster.routed_history",
                format!("{v} is outside 100..=10000000"),
            ));
        }
    };
    let replicas = match raw.replicas.unwrap_or(1) {
        n @ 1..=10_000 => n as u32,
        n => {
            return Err(ConfigError::new(
                "cluster.replicas",
                format!("{n} is outside 1..=10000"),
            ));
        }
    };
    let key_prefix = raw
        .key_prefix
        .unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_owned());
    if key_prefix.len() > 64 || !key_prefix.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            "cluster.key_prefix",
            "at most 64 visible ASCII characters",
        ));
    }
    Ok(Some(ClusterConfig {
        redis: url,
        password: raw.password,
        key_prefix,
        replicas,
        timeout,
        heartbeat,
        slot_lease,
        sync,
        routed_history,
    }))
}

/// What the client connects with: the URL, with `password` over its own.
pub(crate) fn connection_info(
    url: &Secret,
    password: Option<&Secret>,
) -> Result<redis::ConnectionInfo, ConfigError> {
    let info = redis::IntoConnectionInfo::into_connection_info(url.expose()).map_err(|e| {
        // The URL may hold a password: say what is wrong, never echo it.
        ConfigError::new(
            "cluster.redis",
            format!("not a Redis URL (redis://host:port/db): {:?}", e.kind()),
        )
    })?;
    Ok(match password {
        None => info,
        Some(p) => {
            let settings = info.redis_settings().clone().set_password(p.expose());
            info.set_redis_settings(settings)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(redis: &str) -> RawCluster {
        RawCluster {
            redis: Some(Secret::new(redis)),
            ..RawCluster::default()
        }
    }

    #[test]
    fn defaults_and_ranges() {
        let c = validate(Some(raw("redis://127.0.0.1:6379/0")))
            .unwrap()
            .unwrap();
        assert_eq!(c.key_prefix, "kvgate:");
        assert_eq!(c.replicas, 1);
        assert_eq!(c.timeout, Duration::from_millis(100));
        assert_eq!(c.slot_lease, Duration::from_secs(10));
        assert_eq!(c.sync, Some(Duration::from_millis(50)));
        assert_eq!(c.routed_history, 20_000);
        let off = validate(Some(RawCluster {
            sync_ms: Some(0),
            ..raw("redis://h")
        }))
        .unwrap()
        .unwrap();
        assert_eq!(off.sync, None);
        assert_eq!(validate(None).unwrap(), None);
        let err = |r: RawCluster| validate(Some(r)).unwrap_err().to_string();
        let e = err(RawCluster {
            slot_lease_ms: Some(2000),
            ..raw("redis://h")
        });
        assert!(e.contains("cluster.slot_lease_ms"), "{e}");
        let e = err(RawCluster {
            replicas: Some(0),
            ..raw("redis://h")
        });
        assert!(e.contains("cluster.replicas"), "{e}");
        let e = err(RawCluster {
            key_prefix: Some("a b".into()),
            ..raw("redis://h")
        });
        assert!(e.contains("cluster.key_prefix"), "{e}");
        let e = err(RawCluster {
            sync_ms: Some(5),
            ..raw("redis://h")
        });
        assert!(e.contains("cluster.sync_ms"), "{e}");
        let e = err(RawCluster {
            replicas: Some(2),
            ..RawCluster::default()
        });
        assert!(e.contains("cluster.redis"), "{e}");
    }

    #[test]
    fn a_bad_url_is_named_without_its_password() {
        let e = validate(Some(raw("http://user:hunter2@host/0")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster.redis"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn the_password_key_is_applied_over_the_urls() {
        let url = Secret::new("redis://:old@127.0.0.1:6379/2");
        let info = connection_info(&url, Some(&Secret::new("new"))).unwrap();
        assert_eq!(info.redis_settings().password(), Some("new"));
        assert_eq!(info.redis_settings().db(), 2);
        let info = connection_info(&url, None).unwrap();
        assert_eq!(info.redis_settings().password(), Some("old"));
    }
}
