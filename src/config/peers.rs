//! The `peers` and `kill_switch` sections.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

/// The peer store.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeersConfig {
    /// JSON file of paired peers; default `<state_dir>/peers.json`.
    #[serde(default)]
    pub file: Option<PathBuf>,
}

/// Kill-switch from the configuration.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillSwitchConfig {
    /// Refuse every call.
    #[serde(default)]
    pub global: bool,
    /// Refuse calls to these tools.
    #[serde(default)]
    pub tools: Vec<String>,
}
