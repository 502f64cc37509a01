//! The `admin`, `ops`, `log` and `runtime` sections.

use std::net::SocketAddr;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, ConfigError, Derived};

/// The local admin socket.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Path of the socket (mode 0600); default `<state_dir>/admin.sock`.
    #[serde(default)]
    pub socket: Option<PathBuf>,
}

/// Health, readiness and metrics.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpsConfig {
    /// `host:port`; loopback by default. `""` disables it.
    #[serde(default = "default_ops_address")]
    pub address: String,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            address: default_ops_address(),
        }
    }
}

fn default_ops_address() -> String {
    "127.0.0.1:9464".into()
}

/// Logging.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default)]
    pub format: LogFormat,
    /// A tracing filter such as `info` or `carapace=debug`. `RUST_LOG` wins when set.
    #[serde(default = "default_log_level")]
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: default_log_level(),
        }
    }
}

fn default_log_level() -> String {
    "info".into()
}

/// Log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Runtime threads.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Workers serving connections, each an event loop on its own thread (default: one per
    /// core). The first runs on the main thread, which also accepts and runs background tasks.
    #[serde(default)]
    pub worker_threads: Option<usize>,
}

pub(super) fn check_runtime_and_log(
    runtime: Option<&RuntimeConfig>,
    log: Option<&LogConfig>,
    errors: &mut Vec<ConfigError>,
) {
    if runtime.is_some_and(|r| r.worker_threads == Some(0)) {
        errors.push(err("/runtime/worker_threads", "must be at least 1"));
    }
    if let Some(log) = log {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log.level) {
            errors.push(err("/log/level", e.to_string()));
        }
    }
}

pub(super) fn check_ops(ops: &OpsConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    if ops.address.is_empty() {
        return;
    }
    match ops.address.parse::<SocketAddr>() {
        Ok(a) => d.ops_address = Some(a),
        Err(_) => errors.push(err(
            "/ops/address",
            format!("`{}` is not IP:PORT", ops.address),
        )),
    }
}
