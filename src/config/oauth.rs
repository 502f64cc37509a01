//! `front.oauth`: carapace as an OAuth 2.1 resource server for remote MCP callers
//! ([`carapace_filters::bearer`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::{err, fix_path, ConfigError};

/// Bearer tokens from an authorization server, checked on every request of a connection that
/// presents no client certificate.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// This resource's canonical URI (RFC 8707), as callers reach it:
    /// `https://tools.example.com/mcp`. Tokens must name it in `aud`.
    pub resource: String,
    /// The issuer (`iss`) every token must carry, exactly.
    pub issuer: String,
    /// The authorization servers the metadata lists (default: the issuer).
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// The issuer's keys as a JWKS file.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// The issuer's JWKS URL (`https://`, or `http://` on a loopback address), fetched when a
    /// token names a key not held, at most every `jwks_min_refresh_s`, and again once the keys
    /// are `jwks_max_age_s` old.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// PEM CA certificates for `jwks_url` (default: the public web roots).
    #[serde(default)]
    pub jwks_ca_file: Option<PathBuf>,
    #[serde(default = "default_min_refresh_s")]
    pub jwks_min_refresh_s: u64,
    #[serde(default = "default_max_age_s")]
    pub jwks_max_age_s: u64,
    /// More accepted audiences besides `resource`.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Accepted clock difference for `exp`, `nbf` and `iat`, in seconds.
    #[serde(default = "default_skew_s")]
    pub clock_skew_s: u64,
    /// What each scope grants: permission patterns (`tool.call:<name>`, `tool.call:*`,
    /// `resource.read:<uri>`, `prompt.get:<name>`). A scope holds its children along `:`
    /// (`tools` holds `tools:read`).
    pub scopes: BTreeMap<String, Vec<String>>,
    /// The scopes a 401 asks for (space-separated): what basic use needs.
    #[serde(default)]
    pub challenge_scope: Option<String>,
    /// `resource_name` of the metadata.
    #[serde(default)]
    pub resource_name: Option<String>,
}

fn default_skew_s() -> u64 {
    60
}
fn default_min_refresh_s() -> u64 {
    30
}
fn default_max_age_s() -> u64 {
    600
}

/// Largest accepted `clock_skew_s`.
pub const MAX_CLOCK_SKEW_S: u64 = 300;

pub(super) fn resolve_oauth(o: &mut OAuthConfig, base: &Path) {
    if let Some(f) = &mut o.jwks_file {
        fix_path(f, base);
    }
    if let Some(f) = &mut o.jwks_ca_file {
        fix_path(f, base);
    }
}

/// An absolute `https` URL, or `http` on a loopback host (tests, a local issuer).
pub fn check_url(url: &str, allow_path: bool) -> Result<http::Uri, String> {
    let uri: http::Uri = url.parse().map_err(|_| format!("`{url}` is not a URL"))?;
    let host = uri.host().ok_or_else(|| format!("`{url}` has no host"))?;
    let loopback = host == "localhost"
        || host
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") if loopback => {}
        _ => {
            return Err(format!(
                "`{url}` must be https (http only on a loopback host)"
            ))
        }
    }
    if url.contains('#') {
        return Err(format!("`{url}` must not have a fragment"));
    }
    if !allow_path && uri.path_and_query().is_some_and(|p| p.query().is_some()) {
        return Err(format!("`{url}` must not have a query"));
    }
    Ok(uri)
}

const ACTIONS: [&str; 3] = ["tool.call:", "resource.read:", "prompt.get:"];

/// Check an `oauth` section; the issuer's keys when they come from a file. `at` is where the
/// section is (`/front/oauth`, `/outbound/listen/oauth`).
pub(super) fn check_oauth(
    o: &OAuthConfig,
    at: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<jsonwebtoken::jwk::JwkSet> {
    let mut e = |path: &str, m: String| {
        let at = match path {
            "" => at.to_owned(),
            p => format!("{at}/{p}"),
        };
        errors.push(err(at, m))
    };
    check_addresses(o, &mut e);
    check_timing(o, &mut e);
    check_scopes(o, &mut e);
    issuer_keys(o, &mut e)
}

/// Reports a problem at a path inside the `oauth` section (`""` for the section itself).
type Report<'a> = dyn FnMut(&str, String) + 'a;

/// The protected resource, the issuer and the authorization servers are URLs.
fn check_addresses(o: &OAuthConfig, e: &mut Report<'_>) {
    match check_url(&o.resource, false) {
        Ok(u) if u.query().is_some() => e("resource", "must not have a query".into()),
        Ok(_) => {}
        Err(m) => e("resource", m),
    }
    for (i, url) in std::iter::once(&o.issuer)
        .chain(&o.authorization_servers)
        .enumerate()
    {
        if let Err(m) = check_url(url, false) {
            let at = if i == 0 {
                "issuer".into()
            } else {
                format!("authorization_servers/{}", i - 1)
            };
            e(&at, m);
        }
    }
}

/// The clock skew allowed and how often the issuer's keys may and must be fetched again.
fn check_timing(o: &OAuthConfig, e: &mut Report<'_>) {
    if o.clock_skew_s > MAX_CLOCK_SKEW_S {
        e(
            "clock_skew_s",
            format!("must be at most {MAX_CLOCK_SKEW_S}"),
        );
    }
    if !(1..=3600).contains(&o.jwks_min_refresh_s) {
        e("jwks_min_refresh_s", "must be between 1 and 3600".into());
    }
    if o.jwks_max_age_s < o.jwks_min_refresh_s || o.jwks_max_age_s > 86_400 {
        e(
            "jwks_max_age_s",
            "must be between jwks_min_refresh_s and 86400".into(),
        );
    }
}

/// Each scope is a token mapping to action patterns; the challenge names configured scopes.
fn check_scopes(o: &OAuthConfig, e: &mut Report<'_>) {
    if o.scopes.is_empty() {
        e(
            "scopes",
            "at least one scope is required (a token grants only what its scopes map to)".into(),
        );
    }
    for (scope, patterns) in &o.scopes {
        if scope.is_empty() || scope.contains(' ') || scope.contains('"') || scope.contains('\\') {
            e(
                &format!("scopes/{scope}"),
                "a scope is a non-empty token without spaces or quotes".into(),
            );
        }
        for (i, p) in patterns.iter().enumerate() {
            if !ACTIONS.iter().any(|a| p.starts_with(a)) {
                e(
                    &format!("scopes/{scope}/{i}"),
                    format!("`{p}` is not a tool.call:, resource.read: or prompt.get: pattern"),
                );
            }
        }
    }
    for s in o.challenge_scope.iter().flat_map(|s| s.split(' ')) {
        if !o.scopes.contains_key(s) {
            e(
                "challenge_scope",
                format!("`{s}` is not a configured scope"),
            );
        }
    }
}

/// Exactly one of `jwks_file` (read now) and `jwks_url`; the keys when from a file.
fn issuer_keys(o: &OAuthConfig, e: &mut Report<'_>) -> Option<jsonwebtoken::jwk::JwkSet> {
    let keys = match (&o.jwks_file, &o.jwks_url) {
        (Some(f), None) => match read_jwks(f) {
            Ok(k) => Some(k),
            Err(m) => {
                e("jwks_file", m);
                None
            }
        },
        (None, Some(url)) => {
            if let Err(m) = check_url(url, true) {
                e("jwks_url", m);
            }
            None
        }
        _ => {
            e(
                "",
                "exactly one of jwks_file and jwks_url is required".into(),
            );
            None
        }
    };
    if let Some(ca) = &o.jwks_ca_file {
        if o.jwks_url.is_none() {
            e("jwks_ca_file", "only used with jwks_url".into());
        } else if let Err(m) = std::fs::metadata(ca) {
            e("jwks_ca_file", format!("{}: {m}", ca.display()));
        }
    }
    keys
}

/// A JWKS document: the keys carapace can use (RS256, ES256 and EdDSA ones); others are
/// skipped. An error when it is not a JWKS or has no usable key.
pub fn parse_jwks(bytes: &[u8]) -> Result<jsonwebtoken::jwk::JwkSet, String> {
    #[derive(Deserialize)]
    struct Raw {
        keys: Vec<serde_json::Value>,
    }
    let raw: Raw = serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS: {e}"))?;
    if raw.keys.iter().any(|k| k.get("d").is_some()) {
        return Err("the JWKS holds private key material (`d`); give only the public keys".into());
    }
    let keys: Vec<jsonwebtoken::jwk::Jwk> = raw
        .keys
        .into_iter()
        .filter_map(|k| serde_json::from_value(k).ok())
        .collect();
    if keys.is_empty() {
        return Err("the JWKS holds no usable public key".into());
    }
    Ok(jsonwebtoken::jwk::JwkSet { keys })
}

fn read_jwks(path: &Path) -> Result<jsonwebtoken::jwk::JwkSet, String> {
    let bytes = carapace_filters::state_file::read_bounded(path, 1 << 20)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    parse_jwks(&bytes).map_err(|m| format!("{}: {m}", path.display()))
}
