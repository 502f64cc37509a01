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
use std::sync::Arc;

pub mod mcp;

use schemars::JsonSchema;
use serde::Deserialize;

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
}

/// Where nonces and rate limits live.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SharedStateConfig {
    /// `memory`: this process only (the default; nonces survive restarts in the journal).
    /// `redis`: one Redis shared by every replica; when it does not answer, calls are refused
    /// with `DEPENDENCY_UNAVAILABLE`.
    #[serde(default)]
    pub backend: SharedStateBackend,
    /// The Redis server, for `backend: redis`.
    #[serde(default)]
    pub redis: Option<RedisConfig>,
}

/// The store behind nonces and rate limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SharedStateBackend {
    #[default]
    Memory,
    Redis,
}

/// A Redis server.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://HOST:PORT/DB` or `unix:///path/redis.sock`, without a password (use `password`).
    pub url: String,
    /// ACL user name.
    #[serde(default)]
    pub username: Option<String>,
    /// The password, from a file or an environment variable.
    #[serde(default)]
    pub password: Option<SecretRef>,
    /// Prefix of every key carapace writes; replicas of one tool host share it, other tool
    /// hosts on the same Redis must each have their own (their limits would mix).
    pub key_prefix: String,
    /// Longest wait for a connection or an answer, in milliseconds.
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_redis_timeout_ms() -> u64 {
    250
}

/// The outbound role: plain tools-v1 calls from the local agent, routed to paired peers.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboundConfig {
    /// Unix socket the agent sends tools-v1 calls to (mode 0660).
    pub socket: PathBuf,
    /// Paired tool hosts by `component_id`, and where their mTLS tool listener is. Calls are
    /// routed only to these, by the tools they serve, never to a URL from a caller.
    pub peers: BTreeMap<String, OutboundPeerConfig>,
    /// Seconds between rediscoveries of the peers' tools.
    #[serde(default = "default_discovery_interval_s")]
    pub discovery_interval_s: u64,
    /// Skill Gateway v1 skills by `skill_id`: their capabilities are routed here
    /// (`capability -> skill_id -> url`), validated, and signed with the skill's secret.
    #[serde(default)]
    pub skills: BTreeMap<String, OutboundSkillConfig>,
    /// How the agent's socket answers refused calls (as `front.answers`).
    #[serde(default)]
    pub answers: crate::errors::ToolsV1Answers,
}

/// One skill-v1 skill the outbound role calls.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboundSkillConfig {
    /// `http://127.0.0.1:PORT` (loopback) or `https://IP:PORT` (with `ca_file`).
    pub url: String,
    /// The capabilities routed to this skill (the registry's allow-list): only these.
    pub capabilities: Vec<String>,
    /// PEM CA the skill's certificate must chain to (https).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// How each `/run` is authenticated.
    #[serde(default)]
    pub auth: Option<AppAuthConfig>,
    #[serde(default = "default_gateway_protocol_version")]
    pub protocol_version: String,
    #[serde(default = "default_skill_timeout_ms")]
    pub timeout_ms_default: u64,
    #[serde(default = "default_skill_timeout_ms_max")]
    pub timeout_ms_max: u64,
}

/// Where an outbound skill is.
#[derive(Debug, Clone)]
pub struct OutboundSkill {
    pub address: SocketAddr,
    /// CA for https; `None` for loopback http.
    pub ca_file: Option<PathBuf>,
    pub secret: Option<Secret>,
}

/// One outbound peer.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboundPeerConfig {
    /// `https://IP:PORT` of the peer's tools-v1 listener.
    pub url: String,
}

/// The tool-host side of pairing.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairingConfig {
    /// `IP:PORT` of the pairing WebSocket endpoint; never the tool listener's. Plain `ws://`
    /// pairing is for loopback addresses only.
    pub listen: String,
    /// Path of the endpoint.
    #[serde(default = "default_pairing_path")]
    pub path: String,
    /// This tool host's `component_id` (the `<name>` the operator pairs).
    pub component_id: String,
    /// The gateway's Ed25519 public key (base64): only its `pair.init` is answered.
    pub gateway_public_key_ed25519: String,
    /// Serve `wss://` with this certificate (required off loopback); `pair.identity` then
    /// carries its fingerprint, which the gateway checks against the certificate it saw.
    #[serde(default)]
    pub tls: Option<PairingTlsConfig>,
}

/// The pairing endpoint's own certificate.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairingTlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

fn default_pairing_path() -> String {
    "/v1/pair".into()
}

/// The gateway role.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gateway's id, sent in `pair.init` and the common name of its client certificate.
    pub id: String,
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

/// The caller-facing protocol.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FrontConfig {
    pub protocol: Protocol,
    /// skill-v1 only: the skill id served in `/manifest` and expected in `/run`. Defaults to
    /// the app's `skill_id` when the app is a skill-v1 skill.
    #[serde(default)]
    pub skill_id: Option<String>,
    /// skill-v1 only (required there): how callers authenticate each `/run`.
    #[serde(default)]
    pub auth: Option<CallerAuthConfig>,
    /// tools-v1 only: `reference` (call outcomes are HTTP 200 with the envelope's `status`, as
    /// the reference tool host answers) or `http_status` (refusals carry an HTTP error status).
    #[serde(default)]
    pub answers: Option<crate::errors::ToolsV1Answers>,
    /// mcp only: the endpoint, origins, caching and sessions.
    #[serde(default)]
    pub mcp: Option<mcp::McpFrontConfig>,
}

/// Skill Gateway v1 caller authentication.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallerAuthConfig {
    pub mode: AuthModeConfig,
    /// Header carrying the API key (api_key mode, default `X-API-Key`) or a copy of the
    /// signature (hmac mode, default `X-Skill-Signature`; optional on requests).
    #[serde(default)]
    pub header_name: Option<String>,
    /// Active keys; every one is accepted (add the new key, move callers, remove the old).
    pub keys: Vec<KeyConfig>,
    /// Accepted clock difference for `timestamp`, in seconds.
    #[serde(default = "default_skew_s")]
    pub timestamp_skew_s: u64,
    /// How long a nonce stays used, in seconds.
    #[serde(default = "default_nonce_ttl_s")]
    pub nonce_ttl_s: u64,
    /// Most live nonces held; when full, new signed calls are refused (never forgotten).
    #[serde(default = "default_nonce_capacity")]
    pub nonce_capacity: usize,
}

/// Largest accepted `timestamp_skew_s`.
pub const MAX_SKEW_S: u64 = 3600;
/// Largest accepted `nonce_capacity`.
pub const MAX_NONCE_CAPACITY: usize = 100_000_000;

fn default_skew_s() -> u64 {
    120
}
fn default_nonce_ttl_s() -> u64 {
    300
}
fn default_nonce_capacity() -> usize {
    1_000_000
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

/// One named secret.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Name used in logs (the secret never is).
    pub id: String,
    pub secret: SecretRef,
}

/// Where a secret comes from. Secrets are never written inline in the configuration.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SecretRef {
    /// The value of this environment variable.
    Env(String),
    /// The content of this file (one trailing newline is removed).
    File(PathBuf),
}

/// Caller listeners.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListenersConfig {
    /// Local mode: a Unix socket, no authentication and no encryption.
    #[serde(default)]
    pub unix: Option<UnixListenerConfig>,
    /// Remote mode: TCP with TLS 1.3.
    #[serde(default)]
    pub tcp: Option<TcpListenerConfig>,
}

/// A Unix socket listener.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnixListenerConfig {
    pub path: PathBuf,
    /// File mode of the socket, octal digits.
    #[serde(default = "default_socket_mode")]
    pub mode: String,
}

fn default_socket_mode() -> String {
    "0660".into()
}

/// A TCP listener.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TcpListenerConfig {
    /// `host:port` to bind.
    pub address: String,
    /// TLS 1.3; required except for a skill-v1 front on a loopback address.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

/// TLS server settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of this listener.
    pub cert_file: PathBuf,
    /// PEM private key of this listener.
    pub key_file: PathBuf,
    /// PEM CA certificates that client certificates must chain to. Setting it requires a
    /// client certificate on every connection (mTLS); tools-v1 fronts must set it.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// The app behind carapace.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// What the app speaks.
    pub protocol: Protocol,
    /// `http://127.0.0.1:PORT` (loopback) or `unix:/path/to/app.sock`.
    pub address: String,
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

fn default_gateway_protocol_version() -> String {
    "1.0".into()
}
fn default_skill_timeout_ms() -> u64 {
    10_000
}
fn default_skill_timeout_ms_max() -> u64 {
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

fn default_discovery_interval_s() -> u64 {
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

/// Connection, body and concurrency limits.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Open caller connections per listener. At the cap, the oldest connection that is not
    /// a paired peer's and has no call in flight is closed to make room; when there is none,
    /// the new connection is closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections one peer may hold on a listener (a paired peer by its `component_id`,
    /// anyone else by address).
    #[serde(default = "default_max_connections_per_peer")]
    pub max_connections_per_peer: usize,
    /// Time for a connection's first request to arrive, in ms (and the whole life of a
    /// connection whose certificate is not paired).
    #[serde(default = "default_first_request_timeout_ms")]
    pub first_request_timeout_ms: u64,
    /// A connection with no call in flight for this long is closed, in ms.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Largest request head (HTTP/1.1) or header list (HTTP/2), in bytes.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Calls in flight; more are shed with 503.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Largest request body, in bytes.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    /// Time for the whole request body to arrive, in ms.
    #[serde(default = "default_body_timeout_ms")]
    pub body_timeout_ms: u64,
    /// Time for the request head to arrive, in ms (HTTP/1.1 header-read timeout).
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// Time for the TLS handshake, in ms.
    #[serde(default = "default_tls_handshake_timeout_ms")]
    pub tls_handshake_timeout_ms: u64,
    /// Largest response body accepted from the app, in bytes.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// On SIGTERM, how long calls in flight may take to finish, in seconds.
    #[serde(default = "default_drain_timeout_s")]
    pub drain_timeout_s: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: default_max_connections(),
            max_connections_per_peer: default_max_connections_per_peer(),
            first_request_timeout_ms: default_first_request_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            max_header_bytes: default_max_header_bytes(),
            max_in_flight: default_max_in_flight(),
            max_body_bytes: default_max_body_bytes(),
            body_timeout_ms: default_body_timeout_ms(),
            header_read_timeout_ms: default_header_read_timeout_ms(),
            tls_handshake_timeout_ms: default_tls_handshake_timeout_ms(),
            max_response_bytes: default_max_response_bytes(),
            drain_timeout_s: default_drain_timeout_s(),
        }
    }
}

fn default_max_connections() -> usize {
    1024
}
fn default_max_connections_per_peer() -> usize {
    256
}
fn default_first_request_timeout_ms() -> u64 {
    10_000
}
fn default_idle_timeout_ms() -> u64 {
    60_000
}
fn default_max_header_bytes() -> usize {
    16 * 1024
}
fn default_max_in_flight() -> usize {
    256
}
fn default_max_body_bytes() -> u64 {
    1 << 20
}
fn default_body_timeout_ms() -> u64 {
    10_000
}
fn default_header_read_timeout_ms() -> u64 {
    5_000
}
fn default_tls_handshake_timeout_ms() -> u64 {
    5_000
}
fn default_max_response_bytes() -> u64 {
    4 << 20
}
fn default_drain_timeout_s() -> u64 {
    30
}

/// Per-tool settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    /// Lower the tool's `timeout_ms_max` (never raises what the app declares).
    #[serde(default)]
    pub timeout_ms_max: Option<u64>,
}

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
    /// Worker threads of the async runtime (default: one per core).
    #[serde(default)]
    pub worker_threads: Option<usize>,
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

/// A loaded secret; its value never appears in `Debug` output or logs.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Where the app is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// A validated configuration with its secrets loaded.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub source: PathBuf,
    pub app_address: AppAddress,
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

/// The JSON Schema of the configuration file.
///
/// Optional keys are omitted, not `null`: that keeps every error at the key it concerns.
pub fn json_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Config)).expect("serializes");
    drop_null_alternatives(&mut schema);
    require_non_empty_strings(&mut schema);
    // The one string whose emptiness means something: `ops.address: ""` disables the endpoint.
    if let Some(address) = schema.pointer_mut("/$defs/OpsConfig/properties/address") {
        address.as_object_mut().map(|m| m.remove("minLength"));
    }
    schema
}

/// Every string in the file must be non-empty: an empty path, address or name is a mistake
/// (`state_dir: ""` would be the working directory), never a way to say "none".
fn require_non_empty_strings(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let is_string = match m.get("type") {
                Some(Value::String(t)) => t == "string",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
                _ => false,
            };
            if is_string && !m.contains_key("minLength") {
                m.insert("minLength".into(), Value::from(1));
            }
            m.values_mut().for_each(require_non_empty_strings);
        }
        Value::Array(a) => a.iter_mut().for_each(require_non_empty_strings),
        _ => {}
    }
}

/// `anyOf: [X, {type: null}]` becomes `X`, and `type: [T, "null"]` becomes `T`.
fn drop_null_alternatives(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(alts)) = m.get("anyOf") {
                let non_null: Vec<Value> = alts
                    .iter()
                    .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"))
                    .cloned()
                    .collect();
                if non_null.len() == 1 && alts.len() == 2 {
                    m.remove("anyOf");
                    if let Value::Object(inner) = &non_null[0] {
                        for (k, val) in inner {
                            m.entry(k.clone()).or_insert_with(|| val.clone());
                        }
                    }
                }
            }
            if let Some(Value::Array(types)) = m.get("type") {
                let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if rest.len() == 1 {
                    m.insert("type".into(), rest[0].clone());
                }
            }
            for (_, child) in m.iter_mut() {
                drop_null_alternatives(child);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(drop_null_alternatives),
        _ => {}
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

/// Validate configuration text; relative paths in it are resolved against `base`.
pub fn parse(text: &str, base: &Path) -> Result<Loaded, ConfigErrors> {
    let yaml: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| ConfigErrors(vec![err("", format!("not valid YAML: {e}"))]))?;
    let json: serde_json::Value = serde_json::to_value(&yaml)
        .map_err(|e| ConfigErrors(vec![err("", format!("not representable as JSON: {e}"))]))?;

    // Pass 1: structure, against the schema, all errors at once.
    let schema = json_schema();
    let validator = jsonschema::validator_for(&schema).expect("config schema compiles");
    let mut structural: Vec<ConfigError> = validator
        .iter_errors(&json)
        .map(|e| err(e.instance_path().to_string(), e.to_string()))
        .collect();
    if !structural.is_empty() {
        structural.sort_by(|a, b| a.path.cmp(&b.path));
        structural.dedup();
        // Unknown keys aside, a section may be sound: drop them and look again.
        let mut cleaned = json.clone();
        for e in validator.iter_errors(&json) {
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
        let remaining: Vec<ConfigError> = validator
            .iter_errors(&cleaned)
            .map(|e| err(e.instance_path().to_string(), e.to_string()))
            .collect();
        structural.extend(meaning_of_sound_sections(&cleaned, &remaining, base));
        return Err(ConfigErrors(structural));
    }

    // Pass 2: typed.
    let mut config: Config =
        serde_json::from_value(json).map_err(|e| ConfigErrors(vec![err("", e.to_string())]))?;
    resolve_paths(&mut config, base);

    // Pass 3: meaning.
    let mut errors = Vec::new();
    let d = check_meaning(&Parts::of(&config), &mut errors);
    check_telemetry(config.telemetry.as_ref(), &mut errors);
    match d.app_address {
        Some(app_address) if errors.is_empty() => Ok(Loaded {
            config,
            source: PathBuf::new(),
            app_address,
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
        }),
        _ => Err(ConfigErrors(errors)),
    }
}

fn check_telemetry(t: Option<&crate::telemetry::TelemetryConfig>, errors: &mut Vec<ConfigError>) {
    let Some(otlp) = t.and_then(|t| t.otlp.as_ref()) else {
        return;
    };
    if !otlp.endpoint.starts_with("http://") || otlp.endpoint.parse::<http::Uri>().is_err() {
        errors.push(err(
            "/telemetry/otlp/endpoint",
            "must be http://HOST:PORT/v1/traces (OTLP over HTTP; TLS is not built in)",
        ));
    }
    if otlp.export_interval_ms == 0 {
        errors.push(err(
            "/telemetry/otlp/export_interval_ms",
            "must be at least 1",
        ));
    }
}

/// Meaning errors of the sections the schema pass found no error in.
fn meaning_of_sound_sections(
    json: &serde_json::Value,
    structural: &[ConfigError],
    base: &Path,
) -> Vec<ConfigError> {
    /// The section `key`, typed, when no structural error is inside it or names it missing.
    fn sound<T: serde::de::DeserializeOwned>(
        json: &serde_json::Value,
        structural: &[ConfigError],
        key: &str,
    ) -> Option<T> {
        let prefix = format!("/{key}");
        let broken = structural.iter().any(|e| {
            e.path == prefix
                || e.path.starts_with(&format!("{prefix}/"))
                || (e.path.is_empty() && e.message.contains(&format!("\"{key}\"")))
        });
        if broken {
            return None;
        }
        let v = json.get(key).cloned().unwrap_or(serde_json::json!({}));
        serde_json::from_value(v).ok()
    }
    let mut owned = PartsOwned {
        outbound: sound(json, structural, "outbound"),
        pairing: sound(json, structural, "pairing"),
        gateway: sound(json, structural, "gateway"),
        front: sound(json, structural, "front"),
        listeners: sound(json, structural, "listeners"),
        app: sound(json, structural, "app"),
        rate_limits: sound(json, structural, "rate_limits"),
        limits: sound(json, structural, "limits"),
        tools: sound(json, structural, "tools"),
        runtime: sound(json, structural, "runtime"),
        log: sound(json, structural, "log"),
        ops: sound(json, structural, "ops"),
        shared_state: sound(json, structural, "shared_state"),
    };
    owned.resolve(base);
    let mut errors = Vec::new();
    check_meaning(&owned.parts(), &mut errors);
    errors
}

/// Owned sections for [`meaning_of_sound_sections`].
struct PartsOwned {
    outbound: Option<OutboundConfig>,
    pairing: Option<PairingConfig>,
    gateway: Option<GatewayConfig>,
    front: Option<FrontConfig>,
    listeners: Option<ListenersConfig>,
    app: Option<AppConfig>,
    rate_limits: Option<RateLimitsConfig>,
    limits: Option<LimitsConfig>,
    tools: Option<BTreeMap<String, ToolOverride>>,
    runtime: Option<RuntimeConfig>,
    log: Option<LogConfig>,
    ops: Option<OpsConfig>,
    shared_state: Option<SharedStateConfig>,
}

impl PartsOwned {
    fn parts(&self) -> Parts<'_> {
        Parts {
            outbound: self.outbound.as_ref(),
            pairing: self.pairing.as_ref(),
            gateway: self.gateway.as_ref(),
            front: self.front.as_ref(),
            listeners: self.listeners.as_ref(),
            app: self.app.as_ref(),
            rate_limits: self.rate_limits.as_ref(),
            limits: self.limits.as_ref(),
            tools: self.tools.as_ref(),
            runtime: self.runtime.as_ref(),
            log: self.log.as_ref(),
            ops: self.ops.as_ref(),
            shared_state: self.shared_state.as_ref(),
        }
    }

    /// Resolve relative paths as [`resolve_paths`] does for a whole configuration.
    fn resolve(&mut self, base: &Path) {
        if let Some(l) = &mut self.listeners {
            resolve_listeners(l, base);
        }
        if let Some(f) = &mut self.front {
            resolve_front(f, base);
        }
        if let Some(a) = &mut self.app {
            resolve_app(a, base);
        }
        if let Some(p) = &mut self.pairing {
            resolve_pairing(p, base);
        }
        if let Some(s) = &mut self.shared_state {
            resolve_shared_state(s, base);
        }
    }
}

fn fix_path(p: &mut PathBuf, base: &Path) {
    if p.is_relative() {
        *p = base.join(&*p);
    }
}

fn fix_secret(s: &mut SecretRef, base: &Path) {
    if let SecretRef::File(p) = s {
        fix_path(p, base);
    }
}

fn resolve_listeners(l: &mut ListenersConfig, base: &Path) {
    if let Some(u) = &mut l.unix {
        fix_path(&mut u.path, base);
    }
    if let Some(tls) = l.tcp.as_mut().and_then(|t| t.tls.as_mut()) {
        fix_path(&mut tls.cert_file, base);
        fix_path(&mut tls.key_file, base);
        if let Some(ca) = &mut tls.client_ca_file {
            fix_path(ca, base);
        }
    }
}

fn resolve_pairing(p: &mut PairingConfig, base: &Path) {
    if let Some(tls) = &mut p.tls {
        fix_path(&mut tls.cert_file, base);
        fix_path(&mut tls.key_file, base);
    }
}

fn resolve_front(f: &mut FrontConfig, base: &Path) {
    if let Some(auth) = &mut f.auth {
        auth.keys
            .iter_mut()
            .for_each(|k| fix_secret(&mut k.secret, base));
    }
}

fn resolve_app(a: &mut AppConfig, base: &Path) {
    if let Some(auth) = a.skill.as_mut().and_then(|s| s.auth.as_mut()) {
        fix_secret(&mut auth.secret, base);
    }
    if let Some(rest) = a.address.strip_prefix("unix:") {
        let p = Path::new(rest);
        if p.is_relative() && !rest.is_empty() {
            a.address = format!("unix:{}", base.join(p).display());
        }
    }
}

fn resolve_shared_state(s: &mut SharedStateConfig, base: &Path) {
    if let Some(p) = s.redis.as_mut().and_then(|r| r.password.as_mut()) {
        fix_secret(p, base);
    }
}

/// Resolve relative paths against the configuration file's directory.
fn resolve_paths(c: &mut Config, base: &Path) {
    fix_path(&mut c.state_dir, base);
    resolve_shared_state(&mut c.shared_state, base);
    resolve_listeners(&mut c.listeners, base);
    resolve_front(&mut c.front, base);
    resolve_app(&mut c.app, base);
    if let Some(p) = &mut c.pairing {
        resolve_pairing(p, base);
    }
    if let Some(o) = &mut c.outbound {
        fix_path(&mut o.socket, base);
        for skill in o.skills.values_mut() {
            if let Some(ca) = &mut skill.ca_file {
                fix_path(ca, base);
            }
            if let Some(auth) = &mut skill.auth {
                fix_secret(&mut auth.secret, base);
            }
        }
    }
    if let Some(f) = &mut c.peers.file {
        fix_path(f, base);
    }
    if let Some(s) = &mut c.admin.socket {
        fix_path(s, base);
    }
}

/// Load one secret, or say why not.
pub fn load_secret(secret: &SecretRef) -> Result<Secret, String> {
    let bytes = match secret {
        SecretRef::Env(name) => std::env::var(name)
            .map_err(|_| format!("environment variable {name} is not set"))?
            .into_bytes(),
        SecretRef::File(path) => {
            use carapace_filters::state_file::{read_bounded, MAX_SECRET_BYTES};
            let mut b = read_bounded(path, MAX_SECRET_BYTES)
                .map_err(|e| format!("cannot read secret file {}: {e}", path.display()))?;
            if b.ends_with(b"\r\n") {
                b.truncate(b.len() - 2);
            } else if b.ends_with(b"\n") {
                b.truncate(b.len() - 1);
            }
            b
        }
    };
    if bytes.is_empty() {
        return Err("secret is empty".into());
    }
    Ok(Secret(bytes.into()))
}

fn is_valid_header_name(name: &str) -> bool {
    http::HeaderName::from_bytes(name.as_bytes()).is_ok()
}

fn check_pairing(
    p: &PairingConfig,
    listeners: Option<&ListenersConfig>,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    match p.listen.parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 && Some(a) == d.tcp_address => errors.push(err(
            "/pairing/listen",
            "the pairing endpoint must not share the tool listener's port",
        )),
        Ok(a) if !a.ip().is_loopback() && p.tls.is_none() => errors.push(err(
            "/pairing/listen",
            "pairing over plain ws:// is allowed on loopback addresses only; set pairing.tls",
        )),
        Ok(a) => d.pairing_address = Some(a),
        Err(_) => errors.push(err(
            "/pairing/listen",
            format!("`{}` is not IP:PORT", p.listen),
        )),
    }
    if !p.path.starts_with('/') {
        errors.push(err("/pairing/path", "must start with /"));
    }
    if let Some(tls) = &p.tls {
        for (at, f) in [
            ("/pairing/tls/cert_file", &tls.cert_file),
            ("/pairing/tls/key_file", &tls.key_file),
        ] {
            if let Err(e) = std::fs::metadata(f) {
                errors.push(err(at, format!("{}: {e}", f.display())));
            }
        }
    }
    if p.component_id.is_empty() || http::HeaderValue::from_str(&p.component_id).is_err() {
        errors.push(err(
            "/pairing/component_id",
            "must be a non-empty header-safe name",
        ));
    }
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD.decode(&p.gateway_public_key_ed25519);
    if !key.is_ok_and(|k| k.len() == 32) {
        errors.push(err(
            "/pairing/gateway_public_key_ed25519",
            "must be the base64 of a 32-byte Ed25519 public key",
        ));
    }
    if listeners.is_some_and(|l| l.tcp.as_ref().and_then(|t| t.tls.as_ref()).is_none()) {
        errors.push(err(
            "/pairing",
            "pairing installs the mTLS certificate of listeners.tcp, which must be set with tls",
        ));
    }
}

/// The typed sections of a configuration. A section is `None` when the schema pass found an
/// error inside it: its meaning is then not checked, but every other section's still is, so
/// one run names every error.
struct Parts<'a> {
    outbound: Option<&'a OutboundConfig>,
    pairing: Option<&'a PairingConfig>,
    gateway: Option<&'a GatewayConfig>,
    front: Option<&'a FrontConfig>,
    listeners: Option<&'a ListenersConfig>,
    app: Option<&'a AppConfig>,
    rate_limits: Option<&'a RateLimitsConfig>,
    limits: Option<&'a LimitsConfig>,
    tools: Option<&'a BTreeMap<String, ToolOverride>>,
    runtime: Option<&'a RuntimeConfig>,
    log: Option<&'a LogConfig>,
    ops: Option<&'a OpsConfig>,
    shared_state: Option<&'a SharedStateConfig>,
}

impl<'a> Parts<'a> {
    fn of(c: &'a Config) -> Self {
        Parts {
            outbound: c.outbound.as_ref(),
            pairing: c.pairing.as_ref(),
            gateway: c.gateway.as_ref(),
            front: Some(&c.front),
            listeners: Some(&c.listeners),
            app: Some(&c.app),
            rate_limits: Some(&c.rate_limits),
            limits: Some(&c.limits),
            tools: Some(&c.tools),
            runtime: Some(&c.runtime),
            log: Some(&c.log),
            ops: Some(&c.ops),
            shared_state: Some(&c.shared_state),
        }
    }
}

/// What the meaning checks derive from the configuration.
#[derive(Default)]
struct Derived {
    app_address: Option<AppAddress>,
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
}

fn check_shared_state(s: &SharedStateConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    let Some(r) = &s.redis else {
        if s.backend == SharedStateBackend::Redis {
            errors.push(err("/shared_state/redis", "required for backend: redis"));
        }
        return;
    };
    if s.backend != SharedStateBackend::Redis {
        errors.push(err(
            "/shared_state/redis",
            "set only with backend: redis (the memory backend would ignore it)",
        ));
    }
    use redis::IntoConnectionInfo;
    // Never echo any part of the URL: it may hold a password.
    let scheme = r.url.split_once("://").map(|(s, _)| s);
    let query = r.url.split_once('?').map(|(_, q)| q);
    let unix = matches!(scheme, Some("unix" | "redis+unix"));
    if !matches!(scheme, Some("redis" | "unix" | "redis+unix")) {
        errors.push(err(
            "/shared_state/redis/url",
            "must start with redis:// or unix:// (rediss:// is not supported)",
        ));
    } else if query.is_some_and(|q| {
        !(unix
            && q.split('&').all(|kv| {
                kv.strip_prefix("db=")
                    .is_some_and(|d| d.parse::<u32>().is_ok())
            }))
    }) {
        errors.push(err(
            "/shared_state/redis/url",
            "takes no query (only unix:// takes ?db=N): the database goes in the path, the \
             password in password",
        ));
    } else {
        match r.url.as_str().into_connection_info() {
            // Never echo the URL: it may hold a password.
            Err(_) => errors.push(err("/shared_state/redis/url", "not a Redis URL")),
            Ok(info) if info.redis_settings().password().is_some() => errors.push(err(
                "/shared_state/redis/url",
                "holds a password: move it to password (a file or an environment variable)",
            )),
            Ok(_) => {}
        }
    }
    if r.key_prefix.is_empty()
        || r.key_prefix.len() > 128
        || r.key_prefix.contains(char::is_whitespace)
    {
        errors.push(err(
            "/shared_state/redis/key_prefix",
            "must be 1 to 128 characters without spaces",
        ));
    }
    if r.username.is_some() && r.password.is_none() {
        errors.push(err(
            "/shared_state/redis/username",
            "is used only with a password: set password",
        ));
    }
    if !(1..=10_000).contains(&r.timeout_ms) {
        errors.push(err("/shared_state/redis/timeout_ms", "must be 1 to 10000"));
    }
    if let Some(p) = &r.password {
        match load_secret(p) {
            Ok(s) if std::str::from_utf8(s.bytes()).is_err() => {
                errors.push(err("/shared_state/redis/password", "is not UTF-8"))
            }
            Ok(s) => d.redis_password = Some(s),
            Err(m) => errors.push(err("/shared_state/redis/password", m)),
        }
    }
}

fn check_listeners(
    l: &ListenersConfig,
    front: Option<Protocol>,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    if l.unix.is_none() && l.tcp.is_none() {
        errors.push(err("/listeners", "at least one of unix or tcp is required"));
    }
    d.unix_mode = 0o660;
    if let Some(u) = &l.unix {
        match u32::from_str_radix(&u.mode, 8) {
            // Local mode has no authentication: the socket's mode is its access control.
            Ok(m) if m & 0o002 != 0 => errors.push(err(
                "/listeners/unix/mode",
                format!(
                    "`{}` lets every local user write to the unauthenticated socket",
                    u.mode
                ),
            )),
            Ok(m) if m <= 0o777 => d.unix_mode = m,
            _ => errors.push(err(
                "/listeners/unix/mode",
                format!("`{}` is not an octal file mode", u.mode),
            )),
        }
    }
    let Some(t) = &l.tcp else { return };
    match t.address.parse::<SocketAddr>() {
        Ok(a) => d.tcp_address = Some(a),
        Err(_) => errors.push(err(
            "/listeners/tcp/address",
            format!("`{}` is not host:port with an IP host", t.address),
        )),
    }
    match (&t.tls, front) {
        (None, Some(p @ (Protocol::ToolsV1 | Protocol::Mcp))) => errors.push(err(
            "/listeners/tcp/tls",
            format!("a {p} front on TCP requires mTLS (remote mode is mTLS only)"),
        )),
        (Some(tls), Some(p @ (Protocol::ToolsV1 | Protocol::Mcp)))
            if tls.client_ca_file.is_none() =>
        {
            errors.push(err(
                "/listeners/tcp/tls/client_ca_file",
                format!(
                    "a {p} front on TCP requires client certificates (remote mode is mTLS only)"
                ),
            ))
        }
        (None, Some(Protocol::SkillV1)) if !d.tcp_address.is_some_and(|a| a.ip().is_loopback()) => {
            errors.push(err(
                "/listeners/tcp/tls",
                "plain HTTP is only allowed on a loopback address",
            ))
        }
        _ => {}
    }
    if let Some(tls) = &t.tls {
        for (p, f) in [
            ("/listeners/tcp/tls/cert_file", Some(&tls.cert_file)),
            ("/listeners/tcp/tls/key_file", Some(&tls.key_file)),
            (
                "/listeners/tcp/tls/client_ca_file",
                tls.client_ca_file.as_ref(),
            ),
        ] {
            if let Some(f) = f {
                if let Err(e) = std::fs::metadata(f) {
                    errors.push(err(p, format!("{}: {e}", f.display())));
                }
            }
        }
    }
}

fn check_front(
    f: &FrontConfig,
    app: Option<&AppConfig>,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    if f.mcp.is_some() && f.protocol != Protocol::Mcp {
        errors.push(err("/front/mcp", "only an mcp front has this section"));
    }
    match f.protocol {
        Protocol::Mcp => {
            for (set, key) in [
                (f.auth.is_some(), "auth"),
                (f.skill_id.is_some(), "skill_id"),
                (f.answers.is_some(), "answers"),
            ] {
                if set {
                    errors.push(err(
                        format!("/front/{key}"),
                        "not used by an mcp front (callers are paired peers or local)",
                    ));
                }
            }
            d.mcp_session_key = mcp::check(&f.mcp.clone().unwrap_or_default(), errors);
        }
        Protocol::ToolsV1 => {
            if f.auth.is_some() {
                errors.push(err(
                    "/front/auth",
                    "tools-v1 callers are authenticated by mTLS; auth is for skill-v1 fronts",
                ));
            }
            if f.skill_id.is_some() {
                errors.push(err(
                    "/front/skill_id",
                    "only a skill-v1 front has a skill id",
                ));
            }
        }
        Protocol::SkillV1 => {
            if f.answers.is_some() {
                errors.push(err(
                    "/front/answers",
                    "answers is for tools-v1 fronts; skill-v1 answers as Skill Gateway v1 says",
                ));
            }
            d.front_skill_id = f.skill_id.clone().or_else(|| {
                app.and_then(|a| a.skill.as_ref())
                    .map(|s| s.skill_id.clone())
            });
            // Only say it is missing when the app section could be read.
            if d.front_skill_id.is_none() && app.is_some() {
                errors.push(err(
                    "/front/skill_id",
                    "required for a skill-v1 front when the app is not a skill-v1 skill",
                ));
            }
            let Some(auth) = &f.auth else {
                errors.push(err(
                    "/front/auth",
                    "a skill-v1 front requires auth (hmac or api_key)",
                ));
                return;
            };
            if auth.keys.is_empty() {
                errors.push(err("/front/auth/keys", "at least one key is required"));
            }
            let mut ids = std::collections::HashSet::new();
            for (i, k) in auth.keys.iter().enumerate() {
                if !ids.insert(k.id.clone()) {
                    errors.push(err(
                        format!("/front/auth/keys/{i}/id"),
                        format!("duplicate key id `{}`", k.id),
                    ));
                }
                match load_secret(&k.secret) {
                    Ok(s) => d.caller_keys.push((k.id.clone(), s)),
                    Err(m) => errors.push(err(format!("/front/auth/keys/{i}/secret"), m)),
                }
            }
            if let Some(h) = &auth.header_name {
                if !is_valid_header_name(h) {
                    errors.push(err(
                        "/front/auth/header_name",
                        format!("`{h}` is not a header name"),
                    ));
                }
            }
            if !(1..=MAX_SKEW_S).contains(&auth.timestamp_skew_s) {
                errors.push(err(
                    "/front/auth/timestamp_skew_s",
                    format!("must be between 1 and {MAX_SKEW_S}"),
                ));
            }
            if auth.nonce_ttl_s < auth.timestamp_skew_s.saturating_mul(2) {
                errors.push(err(
                    "/front/auth/nonce_ttl_s",
                    "must cover the whole timestamp window (at least 2 x timestamp_skew_s), or a replay inside the window would pass",
                ));
            } else if auth.nonce_ttl_s > 86_400 {
                errors.push(err(
                    "/front/auth/nonce_ttl_s",
                    "must be at most 86400 (a day)",
                ));
            }
            if !(1..=MAX_NONCE_CAPACITY).contains(&auth.nonce_capacity) {
                errors.push(err(
                    "/front/auth/nonce_capacity",
                    format!("must be between 1 and {MAX_NONCE_CAPACITY} (about 30 bytes each)"),
                ));
            }
        }
    }
}

fn check_app(a: &AppConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    d.app_address = if let Some(rest) = a.address.strip_prefix("unix:") {
        if rest.is_empty() {
            errors.push(err("/app/address", "unix: needs the socket's path"));
            None
        } else {
            Some(AppAddress::Unix(PathBuf::from(rest)))
        }
    } else if let Some(rest) = a.address.strip_prefix("http://") {
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
                    format!("`{}` is not http://IP:PORT", a.address),
                ));
                None
            }
        }
    } else {
        errors.push(err(
            "/app/address",
            "must be http://127.0.0.1:PORT (loopback) or unix:/path",
        ));
        None
    };
    match (&a.protocol, &a.skill) {
        (Protocol::Mcp, _) => errors.push(err(
            "/app/protocol",
            "an app speaking MCP is not supported behind carapace; the app must speak tools-v1 or skill-v1",
        )),
        (Protocol::SkillV1, None) => {
            errors.push(err("/app/skill", "required when the app speaks skill-v1"))
        }
        (Protocol::ToolsV1, Some(_)) => {
            errors.push(err("/app/skill", "only for an app that speaks skill-v1"))
        }
        (Protocol::SkillV1, Some(skill)) => {
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
        (Protocol::ToolsV1, None) => {}
    }
    if a.discovery.timeout_ms == 0 {
        errors.push(err("/app/discovery/timeout_ms", "must be at least 1"));
    }
    if a.pool.connect_timeout_ms == 0 {
        errors.push(err("/app/pool/connect_timeout_ms", "must be at least 1"));
    }
}

fn check_meaning(p: &Parts<'_>, errors: &mut Vec<ConfigError>) -> Derived {
    let mut d = Derived::default();
    if let Some(l) = p.listeners {
        check_listeners(l, p.front.map(|f| f.protocol), &mut d, errors);
    }
    if let Some(f) = p.front {
        check_front(f, p.app, &mut d, errors);
    }
    if let Some(a) = p.app {
        check_app(a, &mut d, errors);
    }
    if let Some(pairing) = p.pairing {
        check_pairing(pairing, p.listeners, &mut d, errors);
    }
    if let Some(g) = p.gateway {
        if g.id.is_empty() || http::HeaderValue::from_str(&g.id).is_err() {
            errors.push(err("/gateway/id", "must be a non-empty header-safe name"));
        }
    }
    if let Some(o) = p.outbound {
        if p.gateway.is_none() {
            errors.push(err(
                "/outbound",
                "the outbound role calls paired peers with the gateway's certificate: set gateway",
            ));
        }
        for (id, peer) in &o.peers {
            let addr = peer
                .url
                .strip_prefix("https://")
                .map(|r| r.trim_end_matches('/'))
                .and_then(|r| r.parse::<SocketAddr>().ok());
            match addr {
                Some(a) => {
                    d.outbound_peers.insert(id.clone(), a);
                }
                None => errors.push(err(
                    format!("/outbound/peers/{id}/url"),
                    format!("`{}` is not https://IP:PORT", peer.url),
                )),
            }
        }
        for (id, skill) in &o.skills {
            let at = |k: &str| format!("/outbound/skills/{id}/{k}");
            if skill.capabilities.is_empty() {
                errors.push(err(
                    at("capabilities"),
                    "name at least one capability: only the registry's capabilities are routed",
                ));
            }
            let (secure, rest) = match (
                skill.url.strip_prefix("http://"),
                skill.url.strip_prefix("https://"),
            ) {
                (Some(r), _) => (false, r),
                (_, Some(r)) => (true, r),
                _ => {
                    errors.push(err(
                        at("url"),
                        "must be http://127.0.0.1:PORT or https://IP:PORT",
                    ));
                    continue;
                }
            };
            let Ok(address) = rest.trim_end_matches('/').parse::<SocketAddr>() else {
                errors.push(err(at("url"), format!("`{}` is not IP:PORT", skill.url)));
                continue;
            };
            if !secure && !address.ip().is_loopback() {
                errors.push(err(at("url"), "plain http only to a loopback address"));
            }
            if secure && skill.ca_file.is_none() {
                errors.push(err(at("ca_file"), "required for https"));
            }
            if let Some(ca) = &skill.ca_file {
                if let Err(e) = std::fs::metadata(ca) {
                    errors.push(err(at("ca_file"), format!("{}: {e}", ca.display())));
                }
            }
            let secret = match skill.auth.as_ref().map(|a| load_secret(&a.secret)) {
                Some(Ok(s)) => Some(s),
                Some(Err(m)) => {
                    errors.push(err(at("auth/secret"), m));
                    None
                }
                None => None,
            };
            d.outbound_skills.insert(
                id.clone(),
                OutboundSkill {
                    address,
                    ca_file: skill.ca_file.clone(),
                    secret,
                },
            );
        }
    }
    if let Some(rl) = p.rate_limits {
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
                && p.shared_state
                    .is_some_and(|s| s.backend == SharedStateBackend::Redis)
            {
                // The shared limiter counts in whole microseconds.
                errors.push(err(
                    path,
                    "per_second is at most 1000000 with the redis backend",
                ));
            }
        }
    }
    if let Some(l) = p.limits {
        for (path, v) in [
            ("/limits/max_connections", l.max_connections as u64),
            (
                "/limits/max_connections_per_peer",
                l.max_connections_per_peer as u64,
            ),
            (
                "/limits/first_request_timeout_ms",
                l.first_request_timeout_ms,
            ),
            ("/limits/idle_timeout_ms", l.idle_timeout_ms),
            ("/limits/max_in_flight", l.max_in_flight as u64),
            ("/limits/max_body_bytes", l.max_body_bytes),
            ("/limits/body_timeout_ms", l.body_timeout_ms),
            ("/limits/header_read_timeout_ms", l.header_read_timeout_ms),
            (
                "/limits/tls_handshake_timeout_ms",
                l.tls_handshake_timeout_ms,
            ),
            ("/limits/max_response_bytes", l.max_response_bytes),
        ] {
            if v == 0 {
                errors.push(err(path, "must be at least 1"));
            }
        }
        if l.max_header_bytes < 8192 {
            errors.push(err("/limits/max_header_bytes", "must be at least 8192"));
        }
    }
    for (name, t) in p.tools.into_iter().flatten() {
        if t.timeout_ms_max == Some(0) {
            errors.push(err(
                format!("/tools/{name}/timeout_ms_max"),
                "must be at least 1",
            ));
        }
    }
    if p.runtime.is_some_and(|r| r.worker_threads == Some(0)) {
        errors.push(err("/runtime/worker_threads", "must be at least 1"));
    }
    if let Some(log) = p.log {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log.level) {
            errors.push(err("/log/level", e.to_string()));
        }
    }
    if let Some(s) = p.shared_state {
        check_shared_state(s, &mut d, errors);
    }
    if let Some(ops) = p.ops.filter(|o| !o.address.is_empty()) {
        match ops.address.parse::<SocketAddr>() {
            Ok(a) => d.ops_address = Some(a),
            Err(_) => errors.push(err(
                "/ops/address",
                format!("`{}` is not IP:PORT", ops.address),
            )),
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match parse(text, Path::new("/nonexistent")) {
            Ok(_) => vec![],
            Err(ConfigErrors(e)) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    const MINIMAL: &str = "
state_dir: /tmp/carapace-test
front: { protocol: tools-v1 }
listeners: { unix: { path: /tmp/carapace-test/tools.sock } }
app: { protocol: tools-v1, address: 'http://127.0.0.1:8080' }
";

    #[test]
    fn minimal_config_loads_with_defaults() {
        let l = parse(MINIMAL, Path::new("/")).unwrap();
        assert_eq!(
            l.app_address,
            AppAddress::Tcp("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(l.config.limits.max_body_bytes, 1 << 20);
        assert_eq!(l.ops_address, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(l.unix_mode, 0o660);
    }

    #[test]
    fn every_structural_error_is_named() {
        let e = errors(
            "
state_dir: /tmp/x
front: { protocol: tools-v2, colour: blue }
listeners: { unix: { path: 12, mode: '0600' }, udp: {} }
app: { protocol: tools-v1 }
limits: { max_body_bytes: -1 }
",
        );
        let all = e.join("\n");
        for needle in [
            "/front",
            "colour",
            "tools-v2",
            "udp",
            "address",
            "/limits/max_body_bytes",
        ] {
            assert!(all.contains(needle), "missing {needle} in:\n{all}");
        }
        assert!(e.len() >= 5, "{all}");
    }

    #[test]
    fn every_semantic_error_is_named() {
        let e = errors(
            "
state_dir: /tmp/x
front:
  protocol: skill-v1
  auth:
    mode: hmac
    keys:
      - { id: a, secret: { env: CARAPACE_TEST_UNSET_VAR } }
      - { id: a, secret: { file: /nonexistent/secret } }
    nonce_ttl_s: 10
listeners: { tcp: { address: '0.0.0.0:8443' } }
app: { protocol: tools-v1, address: 'http://10.0.0.1:80' }
rate_limits: { per_peer: { per_second: 0, burst: 1 } }
",
        );
        let all = e.join("\n");
        for needle in [
            "/front/skill_id",
            "CARAPACE_TEST_UNSET_VAR",
            "/front/auth/keys/1/id",
            "/front/auth/keys/1/secret",
            "/front/auth/nonce_ttl_s",
            "/listeners/tcp/tls",
            "/app/address",
            "/rate_limits/per_peer",
        ] {
            assert!(all.contains(needle), "missing {needle} in:\n{all}");
        }
    }

    #[test]
    fn structural_and_semantic_errors_are_named_in_one_run() {
        let e = errors(
            "
state_dir: /tmp/x
front: { protocol: tools-v1, colour: blue }
listeners: { unix: { path: /tmp/x.sock } }
app: { protocol: tools-v1, address: 'http://10.0.0.1:80' }
limits: { max_in_flight: 0 }
",
        );
        let all = e.join("\n");
        for needle in ["colour", "/app/address", "/limits/max_in_flight"] {
            assert!(all.contains(needle), "missing {needle} in:\n{all}");
        }
    }

    #[test]
    fn tools_front_on_tcp_requires_mtls() {
        let e = errors(
            "
state_dir: /tmp/x
front: { protocol: tools-v1 }
listeners: { tcp: { address: '127.0.0.1:8443', tls: { cert_file: /nonexistent/c, key_file: /nonexistent/k } } }
app: { protocol: tools-v1, address: 'unix:/tmp/app.sock' }
",
        );
        let all = e.join("\n");
        assert!(all.contains("client_ca_file"), "{all}");
        assert!(all.contains("cert_file"), "{all}");
    }

    #[test]
    fn secrets_come_from_files_without_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "s3cret\n").unwrap();
        let s = load_secret(&SecretRef::File(f)).unwrap();
        assert_eq!(&**s.bytes(), b"s3cret");
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
    }

    #[test]
    fn inline_secrets_are_not_accepted() {
        let e = errors(
            "
state_dir: /tmp/x
front:
  protocol: skill-v1
  skill_id: s
  auth: { mode: hmac, keys: [ { id: a, secret: 'hunter2' } ] }
listeners: { unix: { path: /tmp/x.sock } }
app: { protocol: tools-v1, address: 'http://127.0.0.1:1' }
",
        );
        assert!(e.join("\n").contains("/front/auth/keys/0/secret"), "{e:?}");
    }

    #[test]
    fn shipped_examples_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&p).unwrap();
                // Examples refer to secrets by environment variable; provide them.
                std::env::set_var("SKILL_HMAC_KEY_2026_11", "k1");
                std::env::set_var("SKILL_HMAC_KEY_2026_05", "k0");
                std::env::set_var("LEGACY_SKILL_SECRET", "k2");
                // Only structure and secrets are checked here: TLS files are placeholders.
                if let Err(ConfigErrors(e)) = parse(&text, &dir) {
                    let bad: Vec<_> = e.iter().filter(|e| !e.path.contains("/tls")).collect();
                    assert!(bad.is_empty(), "{}: {bad:?}", p.display());
                }
                n += 1;
            }
        }
        assert!(n >= 2);
    }

    #[test]
    fn the_shared_state_store_is_checked_without_echoing_secrets() {
        let redis = |r: &str| format!("{MINIMAL}shared_state: {{ backend: redis, redis: {r} }}");
        assert!(errors(&format!("{MINIMAL}shared_state: {{ backend: memory }}")).is_empty());
        for ok in [
            "{ url: 'redis://10.0.0.5:6379/2', key_prefix: 'a:' }",
            "{ url: 'unix:///run/redis.sock?db=2', key_prefix: 'a:' }",
        ] {
            assert!(
                errors(&redis(ok)).is_empty(),
                "{ok}: {:?}",
                errors(&redis(ok))
            );
        }
        let e = errors(&format!("{MINIMAL}shared_state: {{ backend: redis }}"));
        assert_eq!(e, ["/shared_state/redis: required for backend: redis"]);
        let e = errors(&format!(
            "{MINIMAL}shared_state: {{ redis: {{ url: 'redis://h:6379', key_prefix: p }} }}"
        ));
        assert!(e[0].starts_with("/shared_state/redis: set only with backend: redis"));
        let e = errors(&redis(
            "{ url: 'redis://u:hunter2@h:6379', key_prefix: p, timeout_ms: 0, \
             password: { env: CARAPACE_TEST_UNSET_PASSWORD } }",
        ));
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e.iter().any(|m| m.contains("holds a password")), "{e:?}");
        assert!(e
            .iter()
            .any(|m| m.contains("timeout_ms: must be 1 to 10000")));
        assert!(e
            .iter()
            .any(|m| m.contains("CARAPACE_TEST_UNSET_PASSWORD is not set")));
        for (bad, says) in [
            (
                "{ url: 'rediss://h:6379', key_prefix: p }",
                "must start with redis://",
            ),
            (
                "{ url: 'redis:/:hunter2@h:6379', key_prefix: p }",
                "must start with redis://",
            ),
            (
                "{ url: 'redis://h:6379/0?password=hunter2', key_prefix: p }",
                "takes no query",
            ),
            (
                "{ url: 'redis://h:6379', key_prefix: '' }",
                "key_prefix: \"\" is shorter than 1 character",
            ),
            (
                "{ url: 'redis://h:6379', key_prefix: p, username: u }",
                "username: is used only",
            ),
        ] {
            let e = errors(&redis(bad));
            assert_eq!(e.len(), 1, "{bad}: {e:?}");
            assert!(e[0].contains(says), "{bad}: {e:?}");
            assert!(!e[0].contains("hunter2"), "{bad}: {e:?}");
        }
        // The shared limiter counts in microseconds; the local one has no such bound.
        let fast = "rate_limits: { per_tool: { per_second: 2000000, burst: 1 } }";
        let e = errors(&format!(
            "{}\n{fast}\n",
            redis("{ url: 'redis://h:6379', key_prefix: p }")
        ));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("at most 1000000 with the redis backend"),
            "{e:?}"
        );
        assert!(errors(&format!("{MINIMAL}{fast}")).is_empty());
        let e = errors(&format!("{MINIMAL}shared_state: {{ backend: etcd }}"));
        assert!(e[0].starts_with("/shared_state/backend"), "{e:?}");
    }
}
