//! The `outbound` section: the gateway's outbound role, its peers and its skills.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

use super::app::{
    default_discovery_interval_s, default_gateway_protocol_version, default_skill_timeout_ms,
    default_skill_timeout_ms_max, AppAuthConfig,
};
use super::secrets::{load_secret, Secret};
use super::{err, ConfigError, Derived};

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
    /// Tool-definition pinning of the tools the peers and skills serve (as `app.pinning`;
    /// `warn` unless `mode` says otherwise).
    #[serde(default)]
    pub pinning: super::PinningConfig,
    /// The same endpoint (tools-v1, and MCP at `/mcp`) for agents elsewhere: TLS, every
    /// request with an OAuth bearer token.
    #[serde(default)]
    pub listen: Option<OutboundListenConfig>,
    /// Signed EAT catalogs by name: their tools are taken only once the catalog proves
    /// itself, and called with MCP at the `server_url` the verified catalog names.
    #[serde(default)]
    pub eat: BTreeMap<String, OutboundEatConfig>,
    /// The circuit of each peer and skill.
    #[serde(default)]
    pub health: HealthConfig,
}

/// When a provider's circuit opens and how long it stays open.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Transport failures in a row that open the circuit.
    #[serde(default = "default_failures_to_open")]
    pub failures_to_open: u32,
    /// How long the circuit stays open before one call probes the provider; doubled after
    /// each failed probe, up to `max_backoff_ms`.
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            failures_to_open: default_failures_to_open(),
            backoff_ms: default_backoff_ms(),
            max_backoff_ms: default_max_backoff_ms(),
        }
    }
}

fn default_failures_to_open() -> u32 {
    5
}
fn default_backoff_ms() -> u64 {
    1000
}
fn default_max_backoff_ms() -> u64 {
    30_000
}

fn check_health(h: &HealthConfig, errors: &mut Vec<ConfigError>) {
    if !(1..=1000).contains(&h.failures_to_open) {
        errors.push(err(
            "/outbound/health/failures_to_open",
            "must be between 1 and 1000",
        ));
    }
    if h.backoff_ms == 0 || h.backoff_ms > h.max_backoff_ms || h.max_backoff_ms > 3_600_000 {
        errors.push(err(
            "/outbound/health/backoff_ms",
            "must be at least 1 and at most max_backoff_ms (at most 3600000)",
        ));
    }
}

/// One EAT catalog the outbound role discovers tools from.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboundEatConfig {
    /// The catalog: `https://host[:port]/.well-known/api-catalog`.
    pub url: String,
    /// Only tools tagged with one of these `x-mcp-tool.capabilities` are taken (`*`: any).
    pub capabilities: Vec<String>,
    /// PEM CA certificates the host's certificate must chain to (default: the web roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A client certificate and key presented to the host (one that asks for mTLS).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Take a catalog without `X-JWS-Signature` (its tools then rest on TLS alone).
    #[serde(default)]
    pub allow_unsigned: bool,
    /// Only call `server_url`s on the catalog's own origin.
    #[serde(default = "default_true")]
    pub same_origin: bool,
    /// Accepted clock difference for the signature's `iat` and `exp`, in seconds.
    #[serde(default = "default_eat_skew_s")]
    pub clock_skew_s: u64,
    #[serde(default = "default_skill_timeout_ms")]
    pub timeout_ms_default: u64,
    #[serde(default = "default_skill_timeout_ms_max")]
    pub timeout_ms_max: u64,
}

fn default_true() -> bool {
    true
}
fn default_eat_skew_s() -> u64 {
    60
}

/// `outbound.eat.<id>`.
fn check_eat(id: &str, e: &OutboundEatConfig, errors: &mut Vec<ConfigError>) {
    let at = |k: &str| format!("/outbound/eat/{id}/{k}");
    match e.url.parse::<http::Uri>() {
        Ok(u) if u.scheme_str() == Some("https") && u.host().is_some() => {}
        _ => errors.push(err(
            at("url"),
            format!(
                "`{}` is not an https URL (the issuer is a did:web, resolved over https)",
                e.url
            ),
        )),
    }
    if e.capabilities.is_empty() {
        errors.push(err(
            at("capabilities"),
            "name at least one capability (or `*`): only the tools wanted are taken",
        ));
    }
    if e.cert_file.is_some() != e.key_file.is_some() {
        errors.push(err(at("cert_file"), "cert_file and key_file go together"));
    }
    for (k, f) in [
        ("ca_file", &e.ca_file),
        ("cert_file", &e.cert_file),
        ("key_file", &e.key_file),
    ] {
        if let Some(f) = f {
            if let Err(m) = std::fs::metadata(f) {
                errors.push(err(at(k), format!("{}: {m}", f.display())));
            }
        }
    }
    if e.clock_skew_s > 600 {
        errors.push(err(at("clock_skew_s"), "must be at most 600"));
    }
    if e.timeout_ms_default == 0 || e.timeout_ms_default > e.timeout_ms_max {
        errors.push(err(
            at("timeout_ms_default"),
            "must be at least 1 and at most timeout_ms_max",
        ));
    }
}

/// The outbound role's endpoint on TCP, for remote agents.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboundListenConfig {
    /// `host:port` to bind.
    pub address: String,
    /// PEM certificate chain and key of this listener (TLS 1.3; no client certificates).
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// How remote agents authenticate: OAuth 2.1 bearer tokens (as `front.oauth`).
    pub oauth: super::OAuthConfig,
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
    /// Sign every request to this peer with RFC 9421 (the gateway's Ed25519 identity key,
    /// `keyid` the gateway id), for a peer whose front has `auth.mode: http_signature`.
    #[serde(default)]
    pub http_signature: bool,
    /// What to do with an answer whose signed receipt is missing or does not verify against
    /// the peer's paired `public_key_ed25519`.
    #[serde(default)]
    pub receipts: crate::receipts::ReceiptMode,
}

/// `outbound.listen`: its address, its certificate and its OAuth settings.
fn check_listen(l: &OutboundListenConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    match l.address.parse::<SocketAddr>() {
        Ok(a) => d.outbound_listen = Some(a),
        Err(_) => errors.push(err(
            "/outbound/listen/address",
            format!("`{}` is not host:port with an IP host", l.address),
        )),
    }
    for (at, f) in [("cert_file", &l.cert_file), ("key_file", &l.key_file)] {
        if let Err(e) = std::fs::metadata(f) {
            errors.push(err(
                format!("/outbound/listen/{at}"),
                format!("{}: {e}", f.display()),
            ));
        }
    }
    d.outbound_oauth_keys = super::oauth::check_oauth(&l.oauth, "/outbound/listen/oauth", errors);
}

pub(super) fn check_outbound(
    o: &OutboundConfig,
    gateway_set: bool,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    d.outbound_pins = super::pinning::check_pinning(&o.pinning, "/outbound/pinning", errors);
    check_health(&o.health, errors);
    if let Some(l) = &o.listen {
        check_listen(l, d, errors);
    }
    if !gateway_set {
        errors.push(err(
            "/outbound",
            "the outbound role calls paired peers with the gateway's certificate: set gateway",
        ));
    }
    for (id, e) in &o.eat {
        check_eat(id, e, errors);
        if o.peers.contains_key(id) || o.skills.contains_key(id) {
            errors.push(err(
                format!("/outbound/eat/{id}"),
                "a peer or skill has this id: each source needs its own",
            ));
        }
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
        if let Some(checked) = check_skill(id, skill, errors) {
            d.outbound_skills.insert(id.clone(), checked);
        }
    }
}

/// A skill of the outbound role: its address (http only to loopback, https with a CA), its
/// capabilities and its HMAC secret; `None` when its URL is unusable.
fn check_skill(
    id: &str,
    skill: &OutboundSkillConfig,
    errors: &mut Vec<ConfigError>,
) -> Option<OutboundSkill> {
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
            return None;
        }
    };
    let Ok(address) = rest.trim_end_matches('/').parse::<SocketAddr>() else {
        errors.push(err(at("url"), format!("`{}` is not IP:PORT", skill.url)));
        return None;
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
    Some(OutboundSkill {
        address,
        ca_file: skill.ca_file.clone(),
        secret,
    })
}
