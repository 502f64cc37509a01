//! The `front` section: the caller-facing protocol and how its callers authenticate.

use std::path::Path;

use schemars::JsonSchema;
use serde::Deserialize;

use super::app::AppConfig;
use super::secrets::{fix_secret, load_secret, SecretRef};
use super::{err, is_valid_header_name, mcp, ConfigError, Derived, Protocol};

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
    /// mcp only: OAuth 2.1 bearer tokens for callers without a client certificate.
    #[serde(default)]
    pub oauth: Option<super::oauth::OAuthConfig>,
    /// Publish the tools as a signed EAT catalog (`/.well-known/api-catalog`).
    #[serde(default)]
    pub eat: Option<super::eat::EatConfig>,
}

impl FrontConfig {
    /// Whether a tools-v1 or mcp front authenticates each request itself (OAuth bearer tokens
    /// or RFC 9421 signatures), so that its TLS listener may take connections without a
    /// client certificate.
    pub fn authenticates_each_request(&self) -> bool {
        self.oauth.is_some() || self.http_signature()
    }

    /// Whether callers sign each request with RFC 9421 signatures.
    pub fn http_signature(&self) -> bool {
        self.auth
            .as_ref()
            .is_some_and(|a| a.mode == CallerAuthMode::HttpSignature)
    }
}

/// How callers of a front authenticate each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallerAuthMode {
    /// skill-v1: HMAC-SHA256 over the canonical JSON of the signed fields.
    Hmac,
    /// skill-v1: the raw secret in a header.
    ApiKey,
    /// tools-v1 and mcp: RFC 9421 HTTP Message Signatures (`hmac-sha256` with `keys`, or
    /// `ed25519` with a paired peer's identity key, `keyid` its component id).
    HttpSignature,
}

/// Caller authentication: Skill Gateway v1 signatures or API keys, or RFC 9421 signatures.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallerAuthConfig {
    pub mode: CallerAuthMode,
    /// Header carrying the API key (api_key mode, default `X-API-Key`) or a copy of the
    /// signature (hmac mode, default `X-Skill-Signature`; optional on requests).
    #[serde(default)]
    pub header_name: Option<String>,
    /// Active keys; every one is accepted (add the new key, move callers, remove the old).
    /// With `http_signature`, each is an `hmac-sha256` key named by its id as `keyid`.
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    /// Accepted clock difference for `timestamp`, in seconds.
    #[serde(default = "default_skew_s")]
    pub timestamp_skew_s: u64,
    /// http_signature only: the `host:port` names callers reach this front by. When given, a
    /// signed request naming another host is refused, so a request signed for one host cannot
    /// be replayed to another that knows the same key (a gateway signs for every host with one
    /// key). Empty: any host (then share the nonce store between such hosts).
    #[serde(default)]
    pub authorities: Vec<String>,
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

/// One named secret.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Name used in logs (the secret never is).
    pub id: String,
    pub secret: SecretRef,
}
pub(super) fn resolve_front(f: &mut FrontConfig, base: &Path) {
    if let Some(e) = &mut f.eat {
        super::eat::resolve_eat(e, base);
    }
    if let Some(o) = &mut f.oauth {
        super::oauth::resolve_oauth(o, base);
    }
    if let Some(auth) = &mut f.auth {
        auth.keys
            .iter_mut()
            .for_each(|k| fix_secret(&mut k.secret, base));
    }
}
pub(super) fn check_front(
    f: &FrontConfig,
    app: Option<&AppConfig>,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
    if f.mcp.is_some() && f.protocol != Protocol::Mcp {
        errors.push(err("/front/mcp", "only an mcp front has this section"));
    }
    if let Some(e) = &f.eat {
        super::eat::check_eat(e, f.protocol, errors);
    }
    match (&f.oauth, f.protocol) {
        (Some(o), Protocol::Mcp) => {
            d.oauth_keys = super::oauth::check_oauth(o, "/front/oauth", errors)
        }
        (Some(_), p) => errors.push(err(
            "/front/oauth",
            format!("OAuth bearer tokens are for an mcp front, not {p}"),
        )),
        (None, _) => {}
    }
    match f.protocol {
        Protocol::Mcp => {
            check_signed_front(f, d, errors);
            for (set, key) in [
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
            check_signed_front(f, d, errors);
            if f.skill_id.is_some() {
                errors.push(err(
                    "/front/skill_id",
                    "only a skill-v1 front has a skill id",
                ));
            }
        }
        Protocol::SkillV1 => check_skill_v1_front(f, app, d, errors),
    }
}

/// `front.auth` of a tools-v1 or mcp front: only RFC 9421 signatures (their callers are paired
/// peers over mTLS otherwise).
fn check_signed_front(f: &FrontConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    let Some(auth) = &f.auth else { return };
    if auth.mode != CallerAuthMode::HttpSignature {
        errors.push(err(
            "/front/auth/mode",
            format!(
                "a {} front takes only http_signature (hmac and api_key are Skill Gateway v1's)",
                f.protocol
            ),
        ));
    }
    if auth.header_name.is_some() {
        errors.push(err(
            "/front/auth/header_name",
            "not used by http_signature (Signature-Input and Signature carry the signature)",
        ));
    }
    for (i, a) in auth.authorities.iter().enumerate() {
        if a.parse::<http::uri::Authority>().is_err() || a.contains('@') {
            errors.push(err(
                format!("/front/auth/authorities/{i}"),
                format!("`{a}` is not host:port"),
            ));
        }
    }
    check_front_auth(auth, d, errors);
}

/// A skill-v1 front: its skill id and the callers' signing keys.
fn check_skill_v1_front(
    f: &FrontConfig,
    app: Option<&AppConfig>,
    d: &mut Derived,
    errors: &mut Vec<ConfigError>,
) {
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
    match &f.auth {
        Some(auth) if auth.mode == CallerAuthMode::HttpSignature => errors.push(err(
            "/front/auth/mode",
            "a skill-v1 front signs its calls in the body: hmac or api_key",
        )),
        Some(auth) => {
            if !auth.authorities.is_empty() {
                errors.push(err(
                    "/front/auth/authorities",
                    "only for http_signature (a skill-v1 body signature names no host)",
                ));
            }
            check_front_auth(auth, d, errors)
        }
        None => errors.push(err(
            "/front/auth",
            "a skill-v1 front requires auth (hmac or api_key)",
        )),
    }
}

/// `front.auth`: keys, header, timestamp window and the nonce store that covers it.
fn check_front_auth(auth: &CallerAuthConfig, d: &mut Derived, errors: &mut Vec<ConfigError>) {
    // With http_signature, paired peers may sign with their own keys alone.
    if auth.keys.is_empty() && auth.mode != CallerAuthMode::HttpSignature {
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
