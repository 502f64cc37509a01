//! `front.eat`: the signed EAT tool catalog this tool host publishes ([`crate::eat`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, fix_path, ConfigError, Protocol};

/// The EAT catalog at `/.well-known/api-catalog`, with its keys (`/.well-known/jwks.json`,
/// `/.well-known/did.json`) and one OpenAPI document per tool.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EatConfig {
    /// The public origin callers reach this listener at: `https://tools.example.com:8443`
    /// (no path). Every URL in the catalog starts with it, and its host (and port) name the
    /// issuer, `did:web:tools.example.com%3A8443`.
    pub base_url: String,
    /// The MCP endpoint the catalog's tools are called at. Default on an mcp front: its own
    /// endpoint (`base_url` + `front.mcp.path`); required on any other front.
    #[serde(default)]
    pub server_url: Option<String>,
    /// The signing keys, in the form carapace writes; default `<state_dir>/eat-keys.json`,
    /// made at first start.
    #[serde(default)]
    pub keys_file: Option<PathBuf>,
    /// Lifetime of each signature (`exp - iat`), in seconds.
    #[serde(default = "default_signature_ttl_s")]
    pub signature_ttl_s: u64,
    /// `Cache-Control: max-age` of every document, in seconds (never past the signature's
    /// `exp` for the catalog).
    #[serde(default = "default_max_age_s")]
    pub max_age_s: u64,
    /// `metadata.title` and `metadata.description` of the catalog.
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Per tool (by the name callers use): its capability tags and examples.
    #[serde(default)]
    pub tools: BTreeMap<String, EatToolConfig>,
}

/// What the catalog says of one tool beyond its definition.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EatToolConfig {
    /// Semantic capability tags (`x-mcp-tool.capabilities`).
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub examples: Vec<EatExample>,
}

/// One example call (`x-mcp-tool.examples`).
#[derive(Debug, Clone, Deserialize, JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EatExample {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Map<String, serde_json::Value>>,
}

fn default_signature_ttl_s() -> u64 {
    3600
}
fn default_max_age_s() -> u64 {
    300
}

/// Longest signature lifetime: a week.
pub const MAX_SIGNATURE_TTL_S: u64 = 7 * 86_400;
/// Shortest: a minute.
pub const MIN_SIGNATURE_TTL_S: u64 = 60;

impl EatConfig {
    /// The issuer: `did:web:` and the host of `base_url`, its port `%3A`-encoded (did:web §3.1).
    pub fn did(&self) -> String {
        let uri: http::Uri = self.base_url.parse().expect("validated base_url");
        let authority = uri.authority().expect("validated base_url").as_str();
        format!(
            "did:web:{}",
            authority.to_ascii_lowercase().replace(':', "%3A")
        )
    }

    /// `base_url` without a trailing `/`.
    pub fn origin(&self) -> &str {
        self.base_url.trim_end_matches('/')
    }

    /// The MCP endpoint of the catalog's tools.
    pub fn server_url(&self, mcp_path: Option<&str>) -> String {
        match (&self.server_url, mcp_path) {
            (Some(u), _) => u.clone(),
            (None, Some(p)) => format!("{}{p}", self.origin()),
            (None, None) => unreachable!("validated: required when the front is not mcp"),
        }
    }
}

pub(super) fn resolve_eat(e: &mut EatConfig, base: &Path) {
    if let Some(k) = &mut e.keys_file {
        fix_path(k, base);
    }
}

pub(super) fn check_eat(e: &EatConfig, front: Protocol, errors: &mut Vec<ConfigError>) {
    match super::oauth::check_url(&e.base_url, false) {
        Ok(uri) if uri.path() != "/" => errors.push(err(
            "/front/eat/base_url",
            format!("`{}` must be an origin, without a path", e.base_url),
        )),
        Ok(uri) if uri.scheme_str() != Some("https") => errors.push(err(
            "/front/eat/base_url",
            "must be https: the issuer is a did:web, resolved over https",
        )),
        Ok(_) => {}
        Err(m) => errors.push(err("/front/eat/base_url", m)),
    }
    match (&e.server_url, front) {
        (Some(u), _) => {
            if let Err(m) = super::oauth::check_url(u, true) {
                errors.push(err("/front/eat/server_url", m));
            }
        }
        (None, Protocol::Mcp) => {}
        (None, p) => errors.push(err(
            "/front/eat/server_url",
            format!(
                "required: a {p} front is not an MCP server; name the one that serves these tools"
            ),
        )),
    }
    if let Some(k) = &e.keys_file {
        if let Err(m) = std::fs::metadata(k) {
            errors.push(err("/front/eat/keys_file", format!("{}: {m}", k.display())));
        }
    }
    if !(MIN_SIGNATURE_TTL_S..=MAX_SIGNATURE_TTL_S).contains(&e.signature_ttl_s) {
        errors.push(err(
            "/front/eat/signature_ttl_s",
            format!("must be between {MIN_SIGNATURE_TTL_S} and {MAX_SIGNATURE_TTL_S}"),
        ));
    }
    if e.max_age_s > e.signature_ttl_s / 2 {
        errors.push(err(
            "/front/eat/max_age_s",
            "must be at most half of signature_ttl_s, so a cached catalog never outlives its signature",
        ));
    }
    for (name, t) in &e.tools {
        for (i, c) in t.capabilities.iter().enumerate() {
            if c.is_empty() || c.chars().any(char::is_whitespace) {
                errors.push(err(
                    format!("/front/eat/tools/{name}/capabilities/{i}"),
                    format!("`{c}` is not a tag (non-empty, no spaces)"),
                ));
            }
        }
    }
}
