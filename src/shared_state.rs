//! Redis as the state store shared by the replicas of one tool host: the nonce ledger and the
//! rate limiters, so that a nonce is used once across every replica and a limit holds for the
//! whole set.
//!
//! * Nonces: `SET <prefix>nonce:<len(scope)>:<scope>:<nonce> 1 NX PX <ttl>`, one atomic
//!   set-if-absent with its expiry. Only the replica whose `SET` wrote the key accepts the call.
//! * Rate limits: GCRA in one Lua script, so the read and the write of a key's theoretical
//!   arrival time are one atomic step; the time is Redis' own `TIME`, so replicas with drifting
//!   clocks still share one limit. The key expires when its bucket is full again.
//!
//! Every command runs under `timeout_ms`. An error or a late answer fails the call with
//! `DEPENDENCY_UNAVAILABLE` (fail closed): accepting a call without its nonce recorded would
//! open a replay window at every other replica, and letting calls through unlimited is what an
//! attacker who can knock the store over would want. The connection is opened lazily and
//! reopened after a failure, so carapace starts while Redis is still coming up and recovers on
//! its own once Redis is back.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, RedisError};

use carapace_filters::rate_limit::Rate;
use carapace_filters::shared::{SharedLimits, SharedNonces, SharedStateError};
use carapace_filters::BoxFuture;

use crate::config::{RedisConfig, Secret};

/// GCRA: `KEYS[1]` holds the theoretical arrival time in µs of Redis' clock. `ARGV[1]` is the
/// emission interval in µs, `ARGV[2]` the burst. Returns 0 when a cell was taken, otherwise
/// the µs until one is free.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local allow_at = tat - (burst - 1) * interval
if now < allow_at then return allow_at - now end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return 0
";

/// Why the Redis store could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("redis: {0}")]
pub struct RedisSetupError(String);

/// The Redis-backed shared store (cheap to clone: one multiplexed connection).
#[derive(Clone)]
pub struct RedisState {
    conn: ConnectionManager,
    prefix: String,
    timeout: Duration,
    gcra: redis::Script,
}

impl std::fmt::Debug for RedisState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisState")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisState {
    /// Set up the store without connecting (the first command connects). Must be called inside
    /// the Tokio runtime.
    pub fn new(cfg: &RedisConfig, password: Option<&Secret>) -> Result<Self, RedisSetupError> {
        let mut info = cfg
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| RedisSetupError(e.to_string()))?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &cfg.username {
            settings = settings.set_username(user);
        }
        if let Some(p) = password {
            let p = std::str::from_utf8(p.bytes())
                .map_err(|_| RedisSetupError("the password is not UTF-8".into()))?;
            settings = settings.set_password(p);
        }
        info = info.set_redis_settings(settings);
        let client = redis::Client::open(info).map_err(|e| RedisSetupError(e.to_string()))?;
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| RedisSetupError(e.to_string()))?;
        Ok(RedisState {
            conn,
            prefix: cfg.key_prefix.clone(),
            timeout,
            gcra: redis::Script::new(GCRA),
        })
    }

    /// `PING`, for readiness.
    pub async fn ping(&self) -> Result<(), SharedStateError> {
        let mut conn = self.conn.clone();
        let pong: String = self
            .bounded(async move { redis::cmd("PING").query_async(&mut conn).await })
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(SharedStateError(format!("PING answered {pong:?}")))
        }
    }

    fn nonce_key(&self, scope: &str, nonce: &str) -> String {
        // The scope's length keeps ("a:b", "c") and ("a", "b:c") apart.
        format!("{}nonce:{}:{scope}:{nonce}", self.prefix, scope.len())
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, SharedStateError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(SharedStateError(e.to_string())),
            Err(_) => Err(SharedStateError(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

impl SharedNonces for RedisState {
    fn insert_if_absent(
        &self,
        scope: &str,
        nonce: &str,
        ttl: Duration,
    ) -> BoxFuture<Result<bool, SharedStateError>> {
        let this = self.clone();
        let key = self.nonce_key(scope, nonce);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        Box::pin(async move {
            let mut conn = this.conn.clone();
            let set: Option<String> = this
                .bounded(async move {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(1)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async(&mut conn)
                        .await
                })
                .await?;
            Ok(set.is_some())
        })
    }
}

impl SharedLimits for RedisState {
    fn take(
        &self,
        key: &str,
        rate: Rate,
    ) -> BoxFuture<Result<Result<(), Duration>, SharedStateError>> {
        let this = self.clone();
        let key = format!("{}rate:{key}", self.prefix);
        let interval_us = u64::try_from(rate.emission_interval().as_micros()).unwrap_or(u64::MAX);
        let burst = rate.burst.get();
        Box::pin(async move {
            let mut conn = this.conn.clone();
            let gcra = this.gcra.clone();
            let wait_us: i64 = this
                .bounded(async move {
                    gcra.key(&key)
                        .arg(interval_us)
                        .arg(burst)
                        .invoke_async(&mut conn)
                        .await
                })
                .await?;
            Ok(match u64::try_from(wait_us) {
                Ok(0) => Ok(()),
                Ok(us) => Err(Duration::from_micros(us)),
                Err(_) => return Err(SharedStateError(format!("rate script answered {wait_us}"))),
            })
        })
    }
}
