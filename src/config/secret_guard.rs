//! `secret_guard`: credentials do not cross the shell ([`carapace_filters::secret_guard`]).

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::Deserialize;

use super::secrets::{fix_secret, load_secret, Secret, SecretRef};
use super::{err, ConfigError};

/// Whether the guard acts on one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GuardModeConfig {
    Off,
    /// Log what is found; change nothing.
    Warn,
    /// Redact or refuse, as `action` (or the tool's) says.
    Enforce,
}

/// What a credential found does in `enforce` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GuardActionConfig {
    /// Replace it with `[REDACTED:<detector>]`.
    Redact,
    /// Refuse the call (`FORBIDDEN`).
    Refuse,
}

/// The secret guard.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretGuardConfig {
    /// Results leaving the tool-host side (to the caller): `off`, `warn` (default) or
    /// `enforce`.
    #[serde(default)]
    pub inbound: Option<GuardModeConfig>,
    /// Arguments leaving the gateway side (the outbound role, to peers and skills): `off`,
    /// `warn` (default) or `enforce`.
    #[serde(default)]
    pub outbound: Option<GuardModeConfig>,
    /// What a credential found does in `enforce` mode: `redact` (default) or `refuse`.
    #[serde(default)]
    pub action: Option<GuardActionConfig>,
    /// The action per tool (its served name), over `action`.
    #[serde(default)]
    pub tools: BTreeMap<String, GuardActionConfig>,
    /// More detectors: regular expressions (Rust `regex` syntax), named `pattern_<index>`.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// Exact values that must never cross, by reference (`{ env: NAME }`, `{ file: PATH }`),
    /// named `value_<index>`. The secrets carapace itself holds (caller keys, the app's
    /// secret, the skills' secrets, the Redis password) are looked for without being listed.
    #[serde(default)]
    pub values: Vec<SecretRef>,
}

impl SecretGuardConfig {
    pub fn inbound_mode(&self) -> GuardModeConfig {
        self.inbound.unwrap_or(GuardModeConfig::Warn)
    }

    pub fn outbound_mode(&self) -> GuardModeConfig {
        self.outbound.unwrap_or(GuardModeConfig::Warn)
    }
}

pub(super) fn resolve_secret_guard(g: &mut SecretGuardConfig, base: &Path) {
    for v in &mut g.values {
        fix_secret(v, base);
    }
}

/// The configured values, loaded; the patterns checked.
pub(super) fn check_secret_guard(
    g: &SecretGuardConfig,
    errors: &mut Vec<ConfigError>,
) -> Vec<(String, Secret)> {
    if let Err(e) = carapace_filters::secret_guard::Detectors::new(&g.patterns, vec![]) {
        errors.push(err(
            format!("/secret_guard/patterns/{}", e.index),
            e.message,
        ));
    }
    let mut values = Vec::new();
    for (i, v) in g.values.iter().enumerate() {
        match load_secret(v) {
            Ok(s) if s.bytes().len() < carapace_filters::secret_guard::detectors::MIN_VALUE_LEN => {
                errors.push(err(
                    format!("/secret_guard/values/{i}"),
                    "shorter than 8 bytes: it would match ordinary text",
                ))
            }
            Ok(s) => values.push((format!("value_{i}"), s)),
            Err(e) => errors.push(err(format!("/secret_guard/values/{i}"), e)),
        }
    }
    values
}
