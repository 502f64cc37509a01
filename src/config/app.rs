//! The `app` and `tools` sections: the app behind carapace, its discovery, pool and per-tool settings.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::app_command::{child_spec, resolve_command_paths, ChildLimits, EnvValue};
use super::secrets::{fix_secret, load_secret, SecretRef};
use super::{
    err, is_valid_header_name, AppAddress, AppTarget, AuthModeConfig, ConfigError, Derived,
    Protocol,
};

/// The app behind carapace.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// What the app speaks.
    pub protocol: Protocol,
    /// `http://127.0.0.1:PORT` (loopback) or `unix:/path/to/app.sock`. An MCP app is this or
    /// a `command`.
    #[serde(default)]
    pub address: Option<String>,
    /// An MCP app only: a stdio MCP server carapace starts and supervises (argv, no shell).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// The command's environment: nothing else is passed. Values, or secrets by reference
    /// (`{ env: NAME }`, `{ file: PATH }`).
    #[serde(default)]
    pub env: BTreeMap<String, EnvValue>,
    /// The command's working directory.
    #[serde(default)]
    pub working_dir: Option<PathBuf>,
    /// The command's resource limits.
    #[serde(default)]
    pub limits: ChildLimits,
    /// An MCP app over Streamable HTTP: its endpoint's path.
    #[serde(default)]
    pub mcp: Option<McpAppConfig>,
    /// Which of the app's tools are served, under which names and descriptions.
    #[serde(default)]
    pub filter: ToolFilterConfig,
    /// Tool-definition pinning.
    #[serde(default)]
    pub pinning: super::PinningConfig,
    /// skill-v1 apps only (required there).
    #[serde(default)]
    pub skill: Option<SkillAppConfig>,
    /// Tool discovery.
    #[serde(default)]
    pub discovery: DiscoveryConfig,
    /// Connection pool to the app.
    #[serde(default)]
    pub pool: PoolConfig,
}

/// Static tool filtering: applied to what discovery finds, before authorization and before any
/// front offers a tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolFilterConfig {
    /// Only the app's tools matching one of these are served (a name, or a prefix ending in
    /// `*`); empty: all.
    #[serde(default)]
    pub allow: Vec<String>,
    /// The app's tools matching one of these are never served (wins over `allow`).
    #[serde(default)]
    pub deny: Vec<String>,
    /// Serve a tool under another name: the app's name → the served name.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
    /// Replace a tool's description, by served name.
    #[serde(default)]
    pub descriptions: BTreeMap<String, String>,
}

impl ToolFilterConfig {
    pub fn is_empty(&self) -> bool {
        self == &ToolFilterConfig::default()
    }
}

/// An MCP server reached over Streamable HTTP.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpAppConfig {
    /// The MCP endpoint's path.
    #[serde(default = "default_mcp_path")]
    pub path: String,
}

impl Default for McpAppConfig {
    fn default() -> Self {
        McpAppConfig {
            path: default_mcp_path(),
        }
    }
}

fn default_mcp_path() -> String {
    "/mcp".into()
}

/// A skill-v1 app (a legacy `/run` skill).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillAppConfig {
    /// The skill's id; its `/manifest` must say the same.
    pub skill_id: String,
    /// The local registry's capabilities of this skill (`capability -> skill_id -> address`):
    /// only these are served, whatever else the manifest offers.
    pub capabilities: Vec<String>,
    /// How carapace authenticates its `/run` calls to the app, when the app checks itself.
    #[serde(default)]
    pub auth: Option<AppAuthConfig>,
    /// Protocol version sent and required in the manifest.
    #[serde(default = "default_gateway_protocol_version")]
    pub protocol_version: String,
    /// Timeout of a call when the caller gives none, in ms.
    #[serde(default = "default_skill_timeout_ms")]
    pub timeout_ms_default: u64,
    /// Longest timeout a caller may ask for, in ms.
    #[serde(default = "default_skill_timeout_ms_max")]
    pub timeout_ms_max: u64,
}

pub(super) fn default_gateway_protocol_version() -> String {
    "1.0".into()
}
pub(super) fn default_skill_timeout_ms() -> u64 {
    10_000
}
pub(super) fn default_skill_timeout_ms_max() -> u64 {
    120_000
}

/// How carapace signs the calls it makes to a skill-v1 app.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppAuthConfig {
    pub mode: AuthModeConfig,
    /// Header for the API key (default `X-API-Key`) or the signature copy (hmac: sent only if
    /// set, like Vagus does).
    #[serde(default)]
    pub header_name: Option<String>,
    /// The app's own secret.
    pub secret: SecretRef,
}

/// Tool discovery from the app.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Seconds between refreshes (0: only at start and reload).
    #[serde(default = "default_discovery_interval_s")]
    pub interval_s: u64,
    /// Timeout of one discovery request, in ms.
    #[serde(default = "default_discovery_timeout_ms")]
    pub timeout_ms: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            interval_s: default_discovery_interval_s(),
            timeout_ms: default_discovery_timeout_ms(),
        }
    }
}

pub(super) fn default_discovery_interval_s() -> u64 {
    60
}
fn default_discovery_timeout_ms() -> u64 {
    5_000
}

/// Connection pool to the app.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Idle connections kept.
    #[serde(default = "default_pool_idle")]
    pub max_idle: usize,
    /// Seconds an idle connection is kept.
    #[serde(default = "default_pool_idle_timeout_s")]
    pub idle_timeout_s: u64,
    /// Longest wait for a new connection to the app, in ms; then the call fails with
    /// `DEPENDENCY_UNAVAILABLE` (retryable).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_idle: default_pool_idle(),
            idle_timeout_s: default_pool_idle_timeout_s(),
            connect_timeout_ms: default_connect_timeout_ms(),
        }
    }
}

fn default_connect_timeout_ms() -> u64 {
    2_000
}

fn default_pool_idle() -> usize {
    64
}
fn default_pool_idle_timeout_s() -> u64 {
    90
}
/// Per-tool settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    /// Lower the tool's `timeout_ms_max` (never raises what the app declares).
    #[serde(default)]
    pub timeout_ms_max: Option<u64>,
    /// Run calls with an `idempotency_key` once per caller and key (default: when the tool
    /// declares side effects).
    #[serde(default)]
    pub idempotency: Option<bool>,
    /// What a successful call costs its caller (`metering`), in any unit you count in.
    #[serde(default)]
    pub price: Option<u64>,
}
pub(super) fn resolve_app(a: &mut AppConfig, base: &Path) {
    if let Some(auth) = a.skill.as_mut().and_then(|s| s.auth.as_mut()) {
        fix_secret(&mut auth.secret, base);
    }
    if let Some(address) = &mut a.address {
        if let Some(rest) = address.strip_prefix("unix:") {
            let p = Path::new(rest);
            if p.is_relative() && !rest.is_empty() {
                *address = format!("unix:{}", base.join(p).display());
            }
        }
    }
    resolve_command_paths(&mut a.env, &mut a.working_dir, base);
    super::pinning::resolve_pinning(&mut a.pinning, base);
}
pub(super) fn check_app(a: &AppConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    d.app_target = app_target(a, errors);
    match (&a.protocol, &a.skill) {
        (Protocol::Mcp, Some(_)) => {
            errors.push(err("/app/skill", "only for an app that speaks skill-v1"))
        }
        (Protocol::Mcp, None) => {}
        (Protocol::SkillV1, None) => {
            errors.push(err("/app/skill", "required when the app speaks skill-v1"))
        }
        (Protocol::ToolsV1, Some(_)) => {
            errors.push(err("/app/skill", "only for an app that speaks skill-v1"))
        }
        (Protocol::SkillV1, Some(skill)) => check_skill_app(skill, d, errors),
        (Protocol::ToolsV1, None) => {}
    }
    check_filter(&a.filter, errors);
    d.pins = super::pinning::check_pinning(&a.pinning, "/app/pinning", errors);
    if a.discovery.timeout_ms == 0 {
        errors.push(err("/app/discovery/timeout_ms", "must be at least 1"));
    }
    if a.pool.connect_timeout_ms == 0 {
        errors.push(err("/app/pool/connect_timeout_ms", "must be at least 1"));
    }
}

fn check_filter(f: &ToolFilterConfig, errors: &mut Vec<ConfigError>) {
    for (list, key) in [(&f.allow, "allow"), (&f.deny, "deny")] {
        for (i, p) in list.iter().enumerate() {
            if p.is_empty() {
                errors.push(err(format!("/app/filter/{key}/{i}"), "an empty pattern"));
            }
        }
    }
    let mut served = std::collections::BTreeSet::new();
    for (from, to) in &f.rename {
        if to.is_empty() || to.chars().any(char::is_control) {
            errors.push(err(format!("/app/filter/rename/{from}"), "not a tool name"));
        } else if !served.insert(to) {
            errors.push(err(
                format!("/app/filter/rename/{from}"),
                format!("two tools renamed to `{to}`"),
            ));
        }
    }
}

/// Where the app is: an address, or (an MCP app) a command to start.
fn app_target(a: &AppConfig, errors: &mut Vec<ConfigError>) -> Option<AppTarget> {
    if a.mcp.is_some() && (a.protocol != Protocol::Mcp || a.command.is_some()) {
        errors.push(err("/app/mcp", "only for an MCP app reached at an address"));
    }
    if a.mcp.as_ref().is_some_and(|m| !m.path.starts_with('/')) {
        errors.push(err("/app/mcp/path", "a path starts with `/`"));
    }
    let Some(argv) = &a.command else {
        for (set, key) in [
            (!a.env.is_empty(), "env"),
            (a.working_dir.is_some(), "working_dir"),
            (a.limits != ChildLimits::default(), "limits"),
        ] {
            if set {
                errors.push(err(
                    format!("/app/{key}"),
                    "only for an app that is a command",
                ));
            }
        }
        let Some(address) = &a.address else {
            errors.push(err(
                "/app/address",
                "required (an MCP app may give `command` instead)",
            ));
            return None;
        };
        return app_address(address, errors).map(AppTarget::Http);
    };
    if a.protocol != Protocol::Mcp {
        errors.push(err(
            "/app/command",
            "only an MCP app (a stdio MCP server) can be a command",
        ));
        return None;
    }
    if a.address.is_some() {
        errors.push(err("/app/address", "give `address` or `command`, not both"));
        return None;
    }
    let name = argv
        .first()
        .and_then(|p| Path::new(p).file_name())
        .map_or_else(|| "app".into(), |n| n.to_string_lossy().into_owned());
    child_spec(
        &name,
        argv,
        &a.env,
        a.working_dir.as_ref(),
        &a.limits,
        errors,
    )
    .map(AppTarget::Command)
}

/// `app.address`: `http://` on loopback, or `unix:/path`.
fn app_address(address: &str, errors: &mut Vec<ConfigError>) -> Option<AppAddress> {
    if let Some(rest) = address.strip_prefix("unix:") {
        if rest.is_empty() {
            errors.push(err("/app/address", "unix: needs the socket's path"));
            return None;
        }
        return Some(AppAddress::Unix(PathBuf::from(rest)));
    }
    let Some(rest) = address.strip_prefix("http://") else {
        errors.push(err(
            "/app/address",
            "must be http://127.0.0.1:PORT (loopback) or unix:/path",
        ));
        return None;
    };
    match rest.trim_end_matches('/').parse::<SocketAddr>() {
        Ok(addr) if addr.ip().is_loopback() => Some(AppAddress::Tcp(addr)),
        Ok(_) => {
            errors.push(err(
                "/app/address",
                "the app is reached over loopback or a Unix socket only",
            ));
            None
        }
        Err(_) => {
            errors.push(err(
                "/app/address",
                format!("`{address}` is not http://IP:PORT"),
            ));
            None
        }
    }
}

/// `app.skill`: capabilities, timeouts and the secret carapace signs with.
fn check_skill_app(skill: &SkillAppConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    if skill.capabilities.is_empty() {
        errors.push(err(
            "/app/skill/capabilities",
            "name at least one capability: only the registry's capabilities are served",
        ));
    }
    if skill.timeout_ms_default == 0 || skill.timeout_ms_default > skill.timeout_ms_max {
        errors.push(err(
            "/app/skill/timeout_ms_default",
            "must be between 1 and timeout_ms_max",
        ));
    }
    if let Some(auth) = &skill.auth {
        match load_secret(&auth.secret) {
            Ok(s) => d.app_secret = Some(s),
            Err(m) => errors.push(err("/app/skill/auth/secret", m)),
        }
        if let Some(h) = &auth.header_name {
            if !is_valid_header_name(h) {
                errors.push(err(
                    "/app/skill/auth/header_name",
                    format!("`{h}` is not a header name"),
                ));
            }
        }
    }
}

pub(super) fn check_tools(
    tools: Option<&BTreeMap<String, ToolOverride>>,
    errors: &mut Vec<ConfigError>,
) {
    for (name, t) in tools.into_iter().flatten() {
        if t.timeout_ms_max == Some(0) {
            errors.push(err(
                format!("/tools/{name}/timeout_ms_max"),
                "must be at least 1",
            ));
        }
    }
}
