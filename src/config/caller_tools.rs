//! `caller_tools`: the caller-tool relay ([`crate::relay`]).

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, ConfigError};

/// Tools that connected callers offer, relayed over the stream each holds open.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallerToolsConfig {
    /// Most tools one caller may declare.
    #[serde(default = "default_max_tools")]
    pub max_tools_per_caller: usize,
    /// Most calls waiting for one caller's answers; more are refused (`RATE_LIMITED`).
    #[serde(default = "default_max_pending")]
    pub max_pending_per_caller: usize,
    /// Largest arguments sent to a caller, and largest result taken, in bytes.
    #[serde(default = "default_max_argument_bytes")]
    pub max_argument_bytes: usize,
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// How long a call waits for the caller's answer, unless it asks for less (`timeout_ms`),
    /// and the most it may ask for.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms_default: u64,
    #[serde(default = "default_timeout_ms_max")]
    pub timeout_ms_max: u64,
    /// Seconds between keep-alive comments on a quiet stream.
    #[serde(default = "default_keepalive_s")]
    pub keepalive_s: u64,
}

impl Default for CallerToolsConfig {
    fn default() -> Self {
        CallerToolsConfig {
            max_tools_per_caller: default_max_tools(),
            max_pending_per_caller: default_max_pending(),
            max_argument_bytes: default_max_argument_bytes(),
            max_result_bytes: default_max_result_bytes(),
            timeout_ms_default: default_timeout_ms(),
            timeout_ms_max: default_timeout_ms_max(),
            keepalive_s: default_keepalive_s(),
        }
    }
}

fn default_max_tools() -> usize {
    32
}
fn default_max_pending() -> usize {
    16
}
fn default_max_argument_bytes() -> usize {
    64 * 1024
}
fn default_max_result_bytes() -> usize {
    1 << 20
}
fn default_timeout_ms() -> u64 {
    60_000
}
fn default_timeout_ms_max() -> u64 {
    300_000
}
fn default_keepalive_s() -> u64 {
    15
}

pub(super) fn check_caller_tools(c: &CallerToolsConfig, errors: &mut Vec<ConfigError>) {
    let at = |k: &str| format!("/caller_tools/{k}");
    for (k, v, max) in [
        ("max_tools_per_caller", c.max_tools_per_caller, 1024),
        ("max_pending_per_caller", c.max_pending_per_caller, 10_000),
        ("max_argument_bytes", c.max_argument_bytes, 16 << 20),
        ("max_result_bytes", c.max_result_bytes, 16 << 20),
    ] {
        if !(1..=max).contains(&v) {
            errors.push(err(at(k), format!("must be between 1 and {max}")));
        }
    }
    if c.timeout_ms_default == 0 || c.timeout_ms_default > c.timeout_ms_max {
        errors.push(err(
            at("timeout_ms_default"),
            "must be at least 1 and at most timeout_ms_max",
        ));
    }
    if c.timeout_ms_max > 3_600_000 {
        errors.push(err(
            at("timeout_ms_max"),
            "must be at most 3600000 (an hour)",
        ));
    }
    if !(1..=300).contains(&c.keepalive_s) {
        errors.push(err(at("keepalive_s"), "must be between 1 and 300"));
    }
}
