//! `idempotency`: calls with an `idempotency_key` run once ([`crate::idempotency`]).

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, ConfigError};

/// How keyed calls are deduplicated. The keys live where nonces do (`shared_state`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// Off: every call runs, key or not.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// How long a finished call's answer is kept for repeats.
    #[serde(default = "default_window_s")]
    pub window_s: u64,
    /// How long a repeat waits for the first call to finish before it is refused
    /// (`RATE_LIMITED`, retryable).
    #[serde(default = "default_wait_ms")]
    pub wait_ms: u64,
    /// Keys kept in this process, at most (with `shared_state.backend: redis` they expire
    /// in Redis).
    #[serde(default = "default_max_entries")]
    pub max_entries: usize,
    /// Bytes of keys and answers kept in this process, at most.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
    /// Larger answers are not kept (a repeat runs again).
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            enabled: true,
            window_s: default_window_s(),
            wait_ms: default_wait_ms(),
            max_entries: default_max_entries(),
            max_bytes: default_max_bytes(),
            max_result_bytes: default_max_result_bytes(),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_window_s() -> u64 {
    3600
}
fn default_wait_ms() -> u64 {
    30_000
}
fn default_max_entries() -> usize {
    100_000
}
fn default_max_bytes() -> usize {
    64 << 20
}
fn default_max_result_bytes() -> usize {
    256 * 1024
}

pub(super) fn check_idempotency(c: &IdempotencyConfig, errors: &mut Vec<ConfigError>) {
    let at = |k: &str| format!("/idempotency/{k}");
    if !(1..=7 * 24 * 3600).contains(&c.window_s) {
        errors.push(err(at("window_s"), "must be between 1 and 604800"));
    }
    if !(1..=600_000).contains(&c.wait_ms) {
        errors.push(err(at("wait_ms"), "must be between 1 and 600000"));
    }
    if c.max_entries == 0 {
        errors.push(err(at("max_entries"), "must be at least 1"));
    }
    if c.max_result_bytes == 0 || c.max_result_bytes > c.max_bytes {
        errors.push(err(
            at("max_result_bytes"),
            "must be at least 1 and at most max_bytes",
        ));
    }
}
