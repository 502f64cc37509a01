//! The `front.mcp` section: the MCP endpoint's path, allowed origins, list caching and
//! older-era sessions.

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, load_secret, ConfigError, Secret, SecretRef};

/// MCP front settings (`front.protocol: mcp`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpFrontConfig {
    /// Path of the MCP endpoint.
    #[serde(default = "default_path")]
    pub path: String,
    /// `Origin` values accepted (exact, e.g. `https://agent.example`); a request with any
    /// other `Origin` is refused with 403. Requests without `Origin` (not from a browser) are
    /// served.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// `ttlMs` cache hint of `server/discover` and `tools/list` results (2026-07-28).
    #[serde(default = "default_list_ttl_ms")]
    pub list_ttl_ms: u64,
    /// Tools per `tools/list` page.
    #[serde(default = "default_page_size")]
    pub page_size: usize,
    /// Older-era sessions (`Mcp-Session-Id`): the key their ids are sealed with. Replicas
    /// serving the same callers must share it. Default: a key generated at first start into
    /// `<state_dir>/mcp_session.key`.
    #[serde(default)]
    pub session_key: Option<SecretRef>,
    /// A session unused for this long is ended (404 afterwards).
    #[serde(default = "default_session_idle_s")]
    pub session_idle_timeout_s: u64,
    /// No session lives longer than this, used or not.
    #[serde(default = "default_session_max_s")]
    pub session_max_lifetime_s: u64,
}

impl Default for McpFrontConfig {
    fn default() -> Self {
        McpFrontConfig {
            path: default_path(),
            allowed_origins: Vec::new(),
            list_ttl_ms: default_list_ttl_ms(),
            page_size: default_page_size(),
            session_key: None,
            session_idle_timeout_s: default_session_idle_s(),
            session_max_lifetime_s: default_session_max_s(),
        }
    }
}

fn default_path() -> String {
    "/mcp".into()
}
fn default_list_ttl_ms() -> u64 {
    60_000
}
fn default_page_size() -> usize {
    100
}
fn default_session_idle_s() -> u64 {
    3600
}
fn default_session_max_s() -> u64 {
    86_400
}

/// Smallest accepted session key, in bytes.
pub const MIN_SESSION_KEY_BYTES: usize = 32;

/// Check the section; returns the session key when one is configured.
pub fn check(m: &McpFrontConfig, errors: &mut Vec<ConfigError>) -> Option<Secret> {
    if !m.path.starts_with('/') || m.path.contains(['?', '#']) {
        errors.push(err(
            "/front/mcp/path",
            "must be a path starting with `/`, without query or fragment",
        ));
    }
    for (i, o) in m.allowed_origins.iter().enumerate() {
        if o.parse::<http::HeaderValue>().is_err() || !o.contains("://") {
            errors.push(err(
                format!("/front/mcp/allowed_origins/{i}"),
                format!("`{o}` is not an origin such as `https://agent.example`"),
            ));
        }
    }
    if !(1..=1000).contains(&m.page_size) {
        errors.push(err("/front/mcp/page_size", "must be 1 to 1000"));
    }
    if m.session_idle_timeout_s == 0 || m.session_idle_timeout_s > m.session_max_lifetime_s {
        errors.push(err(
            "/front/mcp/session_idle_timeout_s",
            "must be at least 1 and at most session_max_lifetime_s",
        ));
    }
    let key = m.session_key.as_ref()?;
    match load_secret(key) {
        Ok(s) if s.bytes().len() >= MIN_SESSION_KEY_BYTES => Some(s),
        Ok(_) => {
            errors.push(err(
                "/front/mcp/session_key",
                format!("must be at least {MIN_SESSION_KEY_BYTES} bytes"),
            ));
            None
        }
        Err(e) => {
            errors.push(err("/front/mcp/session_key", e));
            None
        }
    }
}
