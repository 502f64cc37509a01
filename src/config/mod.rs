//! Configuration: one YAML file, parsed and validated entirely before any port is bound.
//!
//! Loading is three passes, each collecting every error it finds: the YAML is checked against
//! the JSON Schema generated from these types (unknown keys, wrong types, missing keys), then
//! deserialized, then checked for meaning (files and environment variables that must exist,
//! combinations that are unsafe). `carapace check` prints every error and exits 64.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub mod mcp;

use meaning::{check_meaning, check_telemetry, meaning_of_sound_sections, resolve_paths, Parts};
use schemars::JsonSchema;
use serde::Deserialize;

mod listeners;
pub use listeners::{ListenersConfig, TcpListenerConfig, TlsConfig, UnixListenerConfig};
mod front;
pub use front::{
    CallerAuthConfig, CallerAuthMode, FrontConfig, KeyConfig, MAX_NONCE_CAPACITY, MAX_SKEW_S,
};
mod app;
pub use app::{
    AppAuthConfig, AppConfig, DiscoveryConfig, McpAppConfig, PoolConfig, SkillAppConfig,
    ToolFilterConfig, ToolOverride,
};
mod pinning;
pub use pinning::{PinMode, PinningConfig};
pub mod eat;
pub mod oauth;
pub use eat::EatConfig;
pub use oauth::OAuthConfig;
mod caller_tools;
mod idempotency;
mod ledger;
mod metering;
pub use idempotency::IdempotencyConfig;
pub use metering::{BudgetConfig, MeteringConfig};
mod receipts;
pub use ledger::{LedgerConfig, LedgerFull, LedgerRetention};
pub use receipts::ReceiptsConfig;
mod secret_guard;
pub use caller_tools::CallerToolsConfig;
pub use secret_guard::{GuardActionConfig, GuardModeConfig, SecretGuardConfig};
mod app_command;
pub use app_command::{ChildLimits, ChildSpec, EnvValue};
mod peers;
pub use peers::{KillSwitchConfig, PeersConfig};
mod rate_limits;
pub use rate_limits::{RateConfig, RateLimitsConfig};
mod limits;
pub use limits::LimitsConfig;
mod pairing;
pub use pairing::{GatewayConfig, PairingConfig, PairingTlsConfig};
mod outbound;
pub use outbound::{
    HealthConfig, OutboundConfig, OutboundEatConfig, OutboundListenConfig, OutboundPeerConfig,
    OutboundSkill, OutboundSkillConfig,
};
mod shared_state;
pub use shared_state::{RedisConfig, SharedStateBackend, SharedStateConfig};
mod ops;
pub use ops::{AdminConfig, LogConfig, LogFormat, OpsConfig, RuntimeConfig};
mod secrets;
pub use secrets::{load_secret, Secret, SecretRef};
mod schema;
pub use schema::json_schema;
mod meaning;
#[cfg(test)]
mod tests;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Directory for persistent state: kill-switch state, nonce journal, default admin socket
    /// and peer store.
    pub state_dir: PathBuf,
    /// What callers speak to carapace.
    pub front: FrontConfig,
    /// Where callers connect.
    pub listeners: ListenersConfig,
    /// The app behind carapace.
    pub app: AppConfig,
    /// The store of paired peers (the gateways allowed to call over mTLS).
    #[serde(default)]
    pub peers: PeersConfig,
    /// Kill-switch engaged from the configuration (OR-ed with the runtime switch).
    #[serde(default)]
    pub kill_switch: KillSwitchConfig,
    /// Rate limits.
    #[serde(default)]
    pub rate_limits: RateLimitsConfig,
    /// Connection, body and concurrency limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Per-tool overrides, by tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverride>,
    /// The local admin socket (kill-switch commands).
    #[serde(default)]
    pub admin: AdminConfig,
    /// `/healthz`, `/readyz` and `/metrics`.
    #[serde(default)]
    pub ops: OpsConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// Runtime threads.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// Tool-host role: the pairing endpoint a gateway dials.
    #[serde(default)]
    pub pairing: Option<PairingConfig>,
    /// Gateway role: pairs tool hosts (`carapace pair ...` through the admin socket).
    #[serde(default)]
    pub gateway: Option<GatewayConfig>,
    /// Gateway role: the local socket the agent calls paired tool hosts through.
    #[serde(default)]
    pub outbound: Option<OutboundConfig>,
    /// Where nonces and rate limits live: this process, or a store every replica shares.
    #[serde(default)]
    pub shared_state: SharedStateConfig,
    /// Distributed tracing: spans exported over OTLP (off unless configured).
    #[serde(default)]
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
    /// Credentials do not cross the shell: results leaving the tool-host side, arguments
    /// leaving the gateway side.
    #[serde(default)]
    pub secret_guard: SecretGuardConfig,
    /// The caller-tool relay: tools connected callers offer over their streams.
    #[serde(default)]
    pub caller_tools: Option<CallerToolsConfig>,
    /// Signed receipts of the calls this tool host executes.
    #[serde(default)]
    pub receipts: Option<ReceiptsConfig>,
    /// The invocation ledger (off unless configured).
    #[serde(default)]
    pub ledger: Option<LedgerConfig>,
    /// Calls with an `idempotency_key` run once per caller, tool and key.
    #[serde(default)]
    pub idempotency: IdempotencyConfig,
    /// Budgets of the consumers of priced tools (`tools.<name>.price`).
    #[serde(default)]
    pub metering: Option<MeteringConfig>,
}

/// How a Skill Gateway v1 call authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthModeConfig {
    /// HMAC-SHA256 over the canonical JSON of the signed fields.
    Hmac,
    /// The raw secret in a header.
    ApiKey,
}

/// A protocol carapace speaks, on either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum Protocol {
    /// Remote Tool Protocol: `GET /v1/tools`, `POST /v1/tools/call`.
    #[serde(rename = "tools-v1")]
    ToolsV1,
    /// Skill Gateway v1: `GET /manifest`, `POST /run`.
    #[serde(rename = "skill-v1")]
    SkillV1,
    /// Model Context Protocol over Streamable HTTP (a front only, for now).
    #[serde(rename = "mcp")]
    Mcp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::ToolsV1 => "tools-v1",
            Protocol::SkillV1 => "skill-v1",
            Protocol::Mcp => "mcp",
        })
    }
}

/// One configuration error, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON pointer into the configuration (`/front/auth/keys/0/secret`), or `""`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every error found in a configuration file.
#[derive(Debug, thiserror::Error)]
#[error("{} configuration error(s)", .0.len())]
pub struct ConfigErrors(pub Vec<ConfigError>);

/// Where the app is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// The app behind carapace: reached at an address, or a command carapace starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppTarget {
    Http(AppAddress),
    Command(ChildSpec),
}

/// A validated configuration with its secrets loaded.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub source: PathBuf,
    pub app_target: AppTarget,
    pub tcp_address: Option<SocketAddr>,
    pub ops_address: Option<SocketAddr>,
    pub unix_mode: u32,
    /// Front keys, by id, in configuration order.
    pub caller_keys: Vec<(String, Secret)>,
    pub app_secret: Option<Secret>,
    /// skill-v1 front: the skill id served and expected.
    pub front_skill_id: Option<String>,
    /// mcp front: the configured session key (else one in the state directory).
    pub mcp_session_key: Option<Secret>,
    /// The pairing endpoint's address.
    pub pairing_address: Option<SocketAddr>,
    /// Outbound peers' tool listener addresses, by component id.
    pub outbound_peers: BTreeMap<String, SocketAddr>,
    /// Outbound skills, by skill id.
    pub outbound_skills: BTreeMap<String, OutboundSkill>,
    /// The Redis password, when one is configured.
    pub redis_password: Option<Secret>,
    /// Tool-definition pins of the configuration (`app.pinning.pins` and its `file`).
    pub pins: BTreeMap<String, String>,
    /// The same for the outbound role (`outbound.pinning`).
    pub outbound_pins: BTreeMap<String, String>,
    /// The secret guard's configured values (`secret_guard.values`), loaded.
    pub guard_values: Vec<(String, Secret)>,
    /// `front.oauth.jwks_file`, loaded.
    pub oauth_keys: Option<jsonwebtoken::jwk::JwkSet>,
    /// `outbound.listen.address`.
    pub outbound_listen: Option<SocketAddr>,
    /// `outbound.listen.oauth.jwks_file`, loaded.
    pub outbound_oauth_keys: Option<jsonwebtoken::jwk::JwkSet>,
}

impl Loaded {
    pub fn admin_socket(&self) -> PathBuf {
        self.config
            .admin
            .socket
            .clone()
            .unwrap_or_else(|| self.config.state_dir.join("admin.sock"))
    }

    pub fn peers_file(&self) -> PathBuf {
        self.config
            .peers
            .file
            .clone()
            .unwrap_or_else(|| self.config.state_dir.join("peers.json"))
    }
}

/// The admin socket named by the configuration at `path`, read without validating the rest
/// or loading any secret: an operator must be able to reach the kill-switch from a shell that
/// has none of the secrets.
pub fn admin_socket_of(path: &Path) -> Result<PathBuf, String> {
    let text =
        read_config_file(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text)
        .map_err(|e| format!("{}: not valid YAML: {e}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let get = |k: &str| yaml.get(k);
    let socket = match get("admin")
        .and_then(|a| a.get("socket"))
        .and_then(|s| s.as_str())
    {
        Some(s) => PathBuf::from(s),
        None => match get("state_dir").and_then(|s| s.as_str()) {
            Some(d) => PathBuf::from(d).join("admin.sock"),
            None => {
                return Err(format!(
                    "{}: neither admin.socket nor state_dir is set",
                    path.display()
                ))
            }
        },
    };
    let mut socket = socket;
    fix_path(&mut socket, base);
    Ok(socket)
}

/// The configuration file's text: a regular UTF-8 file of a bounded size.
fn read_config_file(path: &Path) -> std::io::Result<String> {
    use carapace_filters::state_file::{read_bounded, MAX_DOCUMENT_BYTES};
    String::from_utf8(read_bounded(path, MAX_DOCUMENT_BYTES)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Read, validate and load `path`: every error is reported.
pub fn load(path: &Path) -> Result<Loaded, ConfigErrors> {
    let text = read_config_file(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            path: String::new(),
            message: format!("cannot read {}: {e}", path.display()),
        }])
    })?;
    let mut loaded = parse(&text, path.parent().unwrap_or(Path::new(".")))?;
    loaded.source = path.to_path_buf();
    Ok(loaded)
}

fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

/// Where a secret is given (by reference): a value written there in place of the reference
/// is the secret itself, and is not quoted back.
const SECRET_KEYS: [&str; 4] = ["secret", "password", "session_key", "values"];

/// A schema error as a configuration error; the schema's message quotes the value, except
/// where a secret belongs ([`SECRET_KEYS`]).
fn schema_error(e: jsonschema::ValidationError<'_>) -> ConfigError {
    let path = e.instance_path().to_string();
    let secret = path.split('/').any(|part| SECRET_KEYS.contains(&part));
    let message = match secret {
        true => format!(
            "breaks `{}` of the schema (the value is not shown: a secret goes here as {{ env: NAME }} or {{ file: PATH }})",
            e.kind().keyword()
        ),
        false => e.to_string(),
    };
    err(path, message)
}

/// The configuration's structure against the schema: every error at once, with what the
/// sections that are sound (unknown keys aside) mean.
fn check_structure(json: &serde_json::Value, base: &Path) -> Result<(), ConfigErrors> {
    let schema = json_schema();
    let validator = jsonschema::validator_for(&schema).expect("config schema compiles");
    let mut structural: Vec<ConfigError> = validator.iter_errors(json).map(schema_error).collect();
    if structural.is_empty() {
        return Ok(());
    }
    structural.sort_by(|a, b| a.path.cmp(&b.path));
    structural.dedup();
    // Unknown keys aside, a section may be sound: drop them and look again.
    let mut cleaned = json.clone();
    for e in validator.iter_errors(json) {
        if let jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } =
            e.kind()
        {
            let at = e.instance_path().to_string();
            if let Some(serde_json::Value::Object(m)) = cleaned.pointer_mut(&at) {
                unexpected.iter().for_each(|k| {
                    m.remove(k);
                });
            }
        }
    }
    let remaining: Vec<ConfigError> = validator.iter_errors(&cleaned).map(schema_error).collect();
    structural.extend(meaning_of_sound_sections(&cleaned, &remaining, base));
    Err(ConfigErrors(structural))
}

/// Validate configuration text; relative paths in it are resolved against `base`.
pub fn parse(text: &str, base: &Path) -> Result<Loaded, ConfigErrors> {
    let yaml: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| ConfigErrors(vec![err("", format!("not valid YAML: {e}"))]))?;
    let json: serde_json::Value = serde_json::to_value(&yaml)
        .map_err(|e| ConfigErrors(vec![err("", format!("not representable as JSON: {e}"))]))?;

    // Pass 1: structure, against the schema, all errors at once.
    check_structure(&json, base)?;

    // Pass 2: typed.
    let mut config: Config =
        serde_json::from_value(json).map_err(|e| ConfigErrors(vec![err("", e.to_string())]))?;
    resolve_paths(&mut config, base);
    if let Some(l) = &mut config.ledger {
        ledger::resolve_ledger(l, base);
    }
    secret_guard::resolve_secret_guard(&mut config.secret_guard, base);

    // Pass 3: meaning.
    let mut errors = Vec::new();
    let d = check_meaning(&Parts::of(&config), &mut errors);
    check_telemetry(config.telemetry.as_ref(), &mut errors);
    let guard_values = secret_guard::check_secret_guard(&config.secret_guard, &mut errors);
    if let Some(c) = &config.caller_tools {
        caller_tools::check_caller_tools(c, &mut errors);
    }
    receipts::check_receipts(&config, &mut errors);
    if let Some(l) = &config.ledger {
        ledger::check_ledger(l, &mut errors);
    }
    idempotency::check_idempotency(&config.idempotency, &mut errors);
    metering::check_metering(&config, &mut errors);
    match d.app_target {
        Some(app_target) if errors.is_empty() => Ok(Loaded {
            config,
            source: PathBuf::new(),
            app_target,
            tcp_address: d.tcp_address,
            ops_address: d.ops_address,
            unix_mode: d.unix_mode,
            caller_keys: d.caller_keys,
            app_secret: d.app_secret,
            front_skill_id: d.front_skill_id,
            mcp_session_key: d.mcp_session_key,
            pairing_address: d.pairing_address,
            outbound_peers: d.outbound_peers,
            outbound_skills: d.outbound_skills,
            redis_password: d.redis_password,
            pins: d.pins,
            outbound_pins: d.outbound_pins,
            guard_values,
            oauth_keys: d.oauth_keys,
            outbound_listen: d.outbound_listen,
            outbound_oauth_keys: d.outbound_oauth_keys,
        }),
        _ => Err(ConfigErrors(errors)),
    }
}

fn fix_path(p: &mut PathBuf, base: &Path) {
    if p.is_relative() {
        *p = base.join(&*p);
    }
}

fn is_valid_header_name(name: &str) -> bool {
    http::HeaderName::from_bytes(name.as_bytes()).is_ok()
}

/// What the meaning checks derive from the configuration.
#[derive(Default)]
struct Derived {
    app_target: Option<AppTarget>,
    tcp_address: Option<SocketAddr>,
    ops_address: Option<SocketAddr>,
    unix_mode: u32,
    caller_keys: Vec<(String, Secret)>,
    app_secret: Option<Secret>,
    front_skill_id: Option<String>,
    mcp_session_key: Option<Secret>,
    pairing_address: Option<SocketAddr>,
    outbound_peers: BTreeMap<String, SocketAddr>,
    outbound_skills: BTreeMap<String, OutboundSkill>,
    redis_password: Option<Secret>,
    pins: BTreeMap<String, String>,
    outbound_pins: BTreeMap<String, String>,
    oauth_keys: Option<jsonwebtoken::jwk::JwkSet>,
    outbound_listen: Option<SocketAddr>,
    outbound_oauth_keys: Option<jsonwebtoken::jwk::JwkSet>,
}
