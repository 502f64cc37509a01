//! State shared by several replicas: the interfaces a distributed store implements so that a
//! nonce is used once across every replica and a rate limit holds for the whole set.
//!
//! The layers here stay storage-agnostic: [`crate::signature::SignatureVerifier`] records nonces
//! in a [`SharedNonces`] instead of its embedded [`crate::nonce::NonceStore`], and
//! [`crate::rate_limit::KeyedLimits`] takes cells from a [`SharedLimits`] instead of its
//! in-process GCRA limiters. Both calls are asynchronous (a network round trip); a store that
//! cannot answer fails with [`SharedStateError`], which the layers turn into
//! [`crate::Rejection::SharedStateUnavailable`]: the call is refused, never let through
//! unchecked.

use std::time::Duration;

use crate::rate_limit::Rate;
use crate::BoxFuture;

/// The shared store could not give an answer (unreachable, timed out, or answered nonsense).
/// The text is for logs; it never carries a secret.
#[derive(Debug, Clone, thiserror::Error)]
#[error("shared state store unavailable: {0}")]
pub struct SharedStateError(pub String);

/// A replay ledger shared by every replica.
pub trait SharedNonces: Send + Sync + 'static {
    /// Record `(scope, nonce)` for `ttl` if it is not recorded yet, atomically across all
    /// replicas. `Ok(true)`: recorded now (first use); `Ok(false)`: already recorded (replay).
    fn insert_if_absent(
        &self,
        scope: &str,
        nonce: &str,
        ttl: Duration,
    ) -> BoxFuture<Result<bool, SharedStateError>>;
}

/// Rate limiters shared by every replica.
pub trait SharedLimits: Send + Sync + 'static {
    /// Take one cell for `key` under `rate`, atomically across all replicas. `Ok(Ok(()))`:
    /// allowed; `Ok(Err(wait))`: refused, a cell frees up after `wait`.
    fn take(
        &self,
        key: &str,
        rate: Rate,
    ) -> BoxFuture<Result<Result<(), Duration>, SharedStateError>>;
}
