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
//! attacker who can knock the store over would want.
//!
//! A Redis that may evict keys would silently forget live nonces, so before its first answer
//! is trusted (and again after any failure, since a restarted Redis may be configured anew)
//! carapace reads `maxmemory_policy` from `INFO memory` and refuses every call unless it is
//! `noeviction`.
//!
//! The connection is opened lazily, so carapace starts while Redis is still coming up. After
//! [`REBUILD_AFTER`] failures in a row the connection is thrown away and made anew (at most
//! once a second): that recovers from failures the client library does not reconnect after by
//! itself (a refused `AUTH` until the password is in place, a half-open connection whose
//! answers time out).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
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
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local allow_at = tat - (burst - 1) * interval
if now < allow_at then return allow_at - now end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.max(1, math.ceil((new_tat - now) / 1000)))
return 0
";

/// Idempotency: `KEYS[1]` is taken with `ARGV[1]` for `ARGV[2]` ms unless it holds a value,
/// which is returned (nil when taken).
const IDEM_CLAIM: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
";

/// Idempotency: if `KEYS[1]` still holds `ARGV[1]` (our running claim), replace it with
/// `ARGV[2]` for `ARGV[3]` ms, or delete it when `ARGV[2]` is empty.
const IDEM_FINISH: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
";

/// Why the Redis store could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("redis: {0}")]
pub struct RedisSetupError(String);

/// Failures in a row after which the connection is made anew.
pub const REBUILD_AFTER: u32 = 3;

/// The Redis-backed shared store (cheap to clone: one multiplexed connection).
#[derive(Clone)]
pub struct RedisState {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    config: ConnectionManagerConfig,
    conn: ArcSwap<ConnectionManager>,
    /// Failed commands in a row.
    failures: AtomicU32,
    last_rebuild: Mutex<Instant>,
    /// `maxmemory_policy` was read as `noeviction` since the last failure.
    policy_ok: AtomicBool,
    prefix: String,
    timeout: Duration,
    gcra: redis::Script,
    idem_claim: redis::Script,
    idem_finish: redis::Script,
}

impl std::fmt::Debug for RedisState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisState")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
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
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| RedisSetupError(e.to_string()))?;
        Ok(RedisState {
            inner: Arc::new(Inner {
                client,
                config,
                conn: ArcSwap::from_pointee(conn),
                failures: AtomicU32::new(0),
                last_rebuild: Mutex::new(Instant::now()),
                policy_ok: AtomicBool::new(false),
                prefix: cfg.key_prefix.clone(),
                timeout,
                gcra: redis::Script::new(GCRA),
                idem_claim: redis::Script::new(IDEM_CLAIM),
                idem_finish: redis::Script::new(IDEM_FINISH),
            }),
        })
    }

    /// Check that Redis answers and keeps every key until it expires (`noeviction`).
    pub async fn verify(&self) -> Result<(), SharedStateError> {
        self.run(|_| async { Ok(()) }).await
    }

    fn nonce_key(&self, scope: &str, nonce: &str) -> String {
        // The scope's length keeps ("a:b", "c") and ("a", "b:c") apart.
        format!("{}nonce:{}:{scope}:{nonce}", self.inner.prefix, scope.len())
    }

    /// Run `op` on the connection once Redis is known not to evict keys, within the timeout;
    /// count failures and make the connection anew after [`REBUILD_AFTER`] in a row.
    async fn run<T, F, Fut>(&self, op: F) -> Result<T, SharedStateError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let inner = &self.inner;
        let result = async {
            if !inner.policy_ok.load(Ordering::Acquire) {
                let mut conn = (**inner.conn.load()).clone();
                let info: String = self
                    .bounded(async move {
                        redis::cmd("INFO")
                            .arg("memory")
                            .query_async(&mut conn)
                            .await
                    })
                    .await?;
                let policy = info
                    .lines()
                    .find_map(|l| l.strip_prefix("maxmemory_policy:"))
                    .map(str::trim)
                    .unwrap_or("unknown");
                if policy != "noeviction" {
                    return Err(SharedStateError(format!(
                        "Redis maxmemory-policy is {policy}: it could evict live nonces; set \
                         maxmemory-policy noeviction"
                    )));
                }
                inner.policy_ok.store(true, Ordering::Release);
            }
            let conn = (**inner.conn.load()).clone();
            self.bounded(op(conn)).await
        }
        .await;
        match &result {
            Ok(_) => inner.failures.store(0, Ordering::Relaxed),
            Err(_) => {
                inner.policy_ok.store(false, Ordering::Release);
                if inner.failures.fetch_add(1, Ordering::Relaxed) + 1 >= REBUILD_AFTER {
                    self.rebuild();
                }
            }
        }
        result
    }

    /// Throw the connection away and make a new one (lazily connected), at most once a second.
    fn rebuild(&self) {
        let inner = &self.inner;
        let mut last = inner.last_rebuild.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() < Duration::from_secs(1) {
            return;
        }
        *last = Instant::now();
        match ConnectionManager::new_lazy_with_config(inner.client.clone(), inner.config.clone()) {
            Ok(conn) => {
                inner.conn.store(Arc::new(conn));
                inner.failures.store(0, Ordering::Relaxed);
                tracing::info!("shared_state redis connection made anew");
            }
            Err(e) => tracing::warn!("shared_state redis connection not made anew: {e}"),
        }
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, SharedStateError> {
        match tokio::time::timeout(self.inner.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(SharedStateError(e.to_string())),
            Err(_) => Err(SharedStateError(format!(
                "no answer within {} ms",
                self.inner.timeout.as_millis()
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
            let set: Option<String> = this
                .run(|mut conn| async move {
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
        let key = format!("{}rate:{key}", self.inner.prefix);
        let interval_us = u64::try_from(rate.emission_interval().as_micros()).unwrap_or(u64::MAX);
        let burst = rate.burst.get();
        Box::pin(async move {
            let gcra = this.inner.gcra.clone();
            let wait_us: i64 = this
                .run(|mut conn| async move {
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

impl crate::idempotency::IdempotencyStore for RedisState {
    fn claim(
        &self,
        key: &str,
        args_hash: &str,
        token: &str,
        window: Duration,
    ) -> BoxFuture<Result<crate::idempotency::Slot, carapace_filters::Rejection>> {
        use crate::idempotency::{store::slot_of, Slot};
        let this = self.clone();
        let key = format!("{}{key}", self.inner.prefix);
        let value = format!("r:{args_hash}:{token}");
        let ttl_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        Box::pin(async move {
            let script = this.inner.idem_claim.clone();
            let held: Option<String> = this
                .run(|mut conn| async move {
                    script
                        .key(&key)
                        .arg(&value)
                        .arg(ttl_ms)
                        .invoke_async(&mut conn)
                        .await
                })
                .await
                .map_err(|e| carapace_filters::Rejection::SharedStateUnavailable(e.to_string()))?;
            Ok(match held {
                None => Slot::Claimed,
                Some(v) => slot_of(&v).ok_or_else(|| {
                    carapace_filters::Rejection::SharedStateUnavailable(
                        "an idempotency key holds an unreadable value".into(),
                    )
                })?,
            })
        })
    }

    fn finish(
        &self,
        key: &str,
        token: &str,
        args_hash: &str,
        answer: Option<String>,
        window: Duration,
    ) -> BoxFuture<Result<(), carapace_filters::Rejection>> {
        let this = self.clone();
        let key = format!("{}{key}", self.inner.prefix);
        let ours = format!("r:{args_hash}:{token}");
        let value = answer
            .map(|a| format!("d:{args_hash}:{a}"))
            .unwrap_or_default();
        let ttl_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        Box::pin(async move {
            let script = this.inner.idem_finish.clone();
            let _: i64 = this
                .run(|mut conn| async move {
                    script
                        .key(&key)
                        .arg(&ours)
                        .arg(&value)
                        .arg(ttl_ms)
                        .invoke_async(&mut conn)
                        .await
                })
                .await
                .map_err(|e| carapace_filters::Rejection::SharedStateUnavailable(e.to_string()))?;
            Ok(())
        })
    }
}
