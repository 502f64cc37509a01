//! `ledger`: the invocation ledger ([`crate::ledger`]).

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, ConfigError};

/// Every call either side handles, in a hash-chained SQLite database.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    /// The database file. Default: `state_dir/ledger.sqlite3`.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Entries waiting to be written, at most.
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// Rows written in one transaction, at most.
    #[serde(default = "default_batch_max")]
    pub batch_max: usize,
    /// When the queue is full: `drop` the entry (counted) or `refuse` new calls.
    #[serde(default)]
    pub on_full: LedgerFull,
    #[serde(default)]
    pub retention: LedgerRetention,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            path: None,
            queue: default_queue(),
            batch_max: default_batch_max(),
            on_full: LedgerFull::default(),
            retention: LedgerRetention::default(),
        }
    }
}

/// What happens to a call when the ledger's queue is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LedgerFull {
    /// The call goes on; its entry is dropped and counted (`carapace_ledger_dropped_total`).
    #[default]
    Drop,
    /// The call is refused (`DEPENDENCY_UNAVAILABLE`, retryable) before it reaches the app.
    Refuse,
}

/// How long rows are kept.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LedgerRetention {
    /// Rows older than this go (default 30 days).
    #[serde(default = "default_max_age_s")]
    pub max_age_s: u64,
    /// The oldest rows beyond this many go.
    #[serde(default = "default_max_rows")]
    pub max_rows: u64,
}

impl Default for LedgerRetention {
    fn default() -> Self {
        LedgerRetention {
            max_age_s: default_max_age_s(),
            max_rows: default_max_rows(),
        }
    }
}

fn default_queue() -> usize {
    16_384
}
fn default_batch_max() -> usize {
    1024
}
fn default_max_age_s() -> u64 {
    30 * 24 * 3600
}
fn default_max_rows() -> u64 {
    10_000_000
}

pub(super) fn resolve_ledger(l: &mut LedgerConfig, base: &std::path::Path) {
    if let Some(p) = &mut l.path {
        super::fix_path(p, base);
    }
}

pub(super) fn check_ledger(l: &LedgerConfig, errors: &mut Vec<ConfigError>) {
    if !(1..=1_000_000).contains(&l.queue) {
        errors.push(err("/ledger/queue", "must be between 1 and 1000000"));
    }
    if !(1..=100_000).contains(&l.batch_max) {
        errors.push(err("/ledger/batch_max", "must be between 1 and 100000"));
    }
    if l.retention.max_age_s == 0 {
        errors.push(err("/ledger/retention/max_age_s", "must be at least 1"));
    }
    if l.retention.max_rows == 0 {
        errors.push(err("/ledger/retention/max_rows", "must be at least 1"));
    }
}
