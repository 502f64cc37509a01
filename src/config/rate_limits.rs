//! The `rate_limits` section: sustained rates with a burst, per peer, per tool and per named tool.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use super::shared_state::{SharedStateBackend, SharedStateConfig};
use super::{err, ConfigError};

/// A sustained rate (exactly one of `per_second`, `per_minute`, `per_hour`) with a burst:
/// `{ per_minute: 3, burst: 3 }` is three calls a minute, all three at once if need be.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    #[serde(default)]
    pub per_second: Option<u32>,
    #[serde(default)]
    pub per_minute: Option<u32>,
    #[serde(default)]
    pub per_hour: Option<u32>,
    pub burst: u32,
}

impl RateConfig {
    /// The count and the window it is counted over, when exactly one is given.
    pub fn quota(&self) -> Option<(u32, std::time::Duration)> {
        use std::time::Duration;
        match (self.per_second, self.per_minute, self.per_hour) {
            (Some(n), None, None) => Some((n, Duration::from_secs(1))),
            (None, Some(n), None) => Some((n, Duration::from_secs(60))),
            (None, None, Some(n)) => Some((n, Duration::from_secs(3600))),
            _ => None,
        }
    }
}

/// Rate limits (none by default).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitsConfig {
    /// For each peer (checked before the body is read).
    #[serde(default)]
    pub per_peer: Option<RateConfig>,
    /// For each tool, unless the tool has its own below.
    #[serde(default)]
    pub per_tool: Option<RateConfig>,
    /// Per-tool rates, by tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, RateConfig>,
}

pub(super) fn check_rate_limits(
    rl: &RateLimitsConfig,
    shared_state: Option<&SharedStateConfig>,
    errors: &mut Vec<ConfigError>,
) {
    let mut rates: Vec<(String, RateConfig)> = Vec::new();
    if let Some(r) = rl.per_peer {
        rates.push(("/rate_limits/per_peer".into(), r));
    }
    if let Some(r) = rl.per_tool {
        rates.push(("/rate_limits/per_tool".into(), r));
    }
    for (name, r) in &rl.tools {
        rates.push((format!("/rate_limits/tools/{name}"), *r));
    }
    for (path, r) in rates {
        let Some((n, window)) = r.quota() else {
            errors.push(err(
                path,
                "give exactly one of per_second, per_minute, per_hour",
            ));
            continue;
        };
        if n == 0 || r.burst == 0 {
            errors.push(err(path, "the rate and burst must be at least 1"));
        } else if window / n < std::time::Duration::from_micros(1)
            && shared_state.is_some_and(|s| s.backend == SharedStateBackend::Redis)
        {
            // The shared limiter counts in whole microseconds.
            errors.push(err(
                path,
                "per_second is at most 1000000 with the redis backend",
            ));
        }
    }
}
