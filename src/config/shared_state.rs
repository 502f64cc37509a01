//! The `shared_state` section: where nonces and rate limits live (in memory or Redis).

use std::path::Path;

use schemars::JsonSchema;
use serde::Deserialize;

use super::secrets::{fix_secret, load_secret, SecretRef};
use super::{err, ConfigError, Derived};

/// Where nonces and rate limits live.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SharedStateConfig {
    /// `memory`: this process only (the default; nonces survive restarts in the journal).
    /// `redis`: one Redis shared by every replica; when it does not answer, calls are refused
    /// with `DEPENDENCY_UNAVAILABLE`.
    #[serde(default)]
    pub backend: SharedStateBackend,
    /// The Redis server, for `backend: redis`.
    #[serde(default)]
    pub redis: Option<RedisConfig>,
}

/// The store behind nonces and rate limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SharedStateBackend {
    #[default]
    Memory,
    Redis,
}

/// A Redis server.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://HOST:PORT/DB` or `unix:///path/redis.sock`, without a password (use `password`).
    pub url: String,
    /// ACL user name.
    #[serde(default)]
    pub username: Option<String>,
    /// The password, from a file or an environment variable.
    #[serde(default)]
    pub password: Option<SecretRef>,
    /// Prefix of every key carapace writes; replicas of one tool host share it, other tool
    /// hosts on the same Redis must each have their own (their limits would mix).
    pub key_prefix: String,
    /// Longest wait for a connection or an answer, in milliseconds.
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_redis_timeout_ms() -> u64 {
    250
}
pub(super) fn resolve_shared_state(s: &mut SharedStateConfig, base: &Path) {
    if let Some(p) = s.redis.as_mut().and_then(|r| r.password.as_mut()) {
        fix_secret(p, base);
    }
}
pub(super) fn check_shared_state(
    s: &SharedStateConfig,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    let Some(r) = &s.redis else {
        if s.backend == SharedStateBackend::Redis {
            errors.push(err("/shared_state/redis", "required for backend: redis"));
        }
        return;
    };
    if s.backend != SharedStateBackend::Redis {
        errors.push(err(
            "/shared_state/redis",
            "set only with backend: redis (the memory backend would ignore it)",
        ));
    }
    use redis::IntoConnectionInfo;
    // Never echo any part of the URL: it may hold a password.
    let scheme = r.url.split_once("://").map(|(s, _)| s);
    let query = r.url.split_once('?').map(|(_, q)| q);
    let unix = matches!(scheme, Some("unix" | "redis+unix"));
    if !matches!(scheme, Some("redis" | "unix" | "redis+unix")) {
        errors.push(err(
            "/shared_state/redis/url",
            "must start with redis:// or unix:// (rediss:// is not supported)",
        ));
    } else if query.is_some_and(|q| {
        !(unix
            && q.split('&').all(|kv| {
                kv.strip_prefix("db=")
                    .is_some_and(|d| d.parse::<u32>().is_ok())
            }))
    }) {
        errors.push(err(
            "/shared_state/redis/url",
            "takes no query (only unix:// takes ?db=N): the database goes in the path, the \
             password in password",
        ));
    } else {
        match r.url.as_str().into_connection_info() {
            // Never echo the URL: it may hold a password.
            Err(_) => errors.push(err("/shared_state/redis/url", "not a Redis URL")),
            Ok(info) if info.redis_settings().password().is_some() => errors.push(err(
                "/shared_state/redis/url",
                "holds a password: move it to password (a file or an environment variable)",
            )),
            Ok(_) => {}
        }
    }
    if r.key_prefix.is_empty()
        || r.key_prefix.len() > 128
        || r.key_prefix.contains(char::is_whitespace)
    {
        errors.push(err(
            "/shared_state/redis/key_prefix",
            "must be 1 to 128 characters without spaces",
        ));
    }
    if r.username.is_some() && r.password.is_none() {
        errors.push(err(
            "/shared_state/redis/username",
            "is used only with a password: set password",
        ));
    }
    if !(1..=10_000).contains(&r.timeout_ms) {
        errors.push(err("/shared_state/redis/timeout_ms", "must be 1 to 10000"));
    }
    if let Some(p) = &r.password {
        match load_secret(p) {
            Ok(s) if std::str::from_utf8(s.bytes()).is_err() => {
                errors.push(err("/shared_state/redis/password", "is not UTF-8"))
            }
            Ok(s) => d.redis_password = Some(s),
            Err(m) => errors.push(err("/shared_state/redis/password", m)),
        }
    }
}
