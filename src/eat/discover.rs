//! Verified discovery: fetch a catalog and believe it only as far as it proves itself, in the
//! EAT text's order. The JWS (refused unless RS256 with a `kid`); the key, from the issuer's
//! did:web document, else its JWKS; the signature; the catalog hash over the RFC 8785 form;
//! `iat`/`exp` with a small skew; the catalog against the text's schema and Conformance
//! rules; then per tool, its OpenAPI document fetched and checked against `spec_hash`.
//!
//! The catalog URL is the trust root: the issuer must be the did:web of the catalog's own
//! host, and nothing is fetched from another origin (a `spec_url` elsewhere refuses the tool),
//! so a catalog cannot point carapace's requests anywhere else.

use std::future::Future;

use bytes::Bytes;
use serde_json::Value;

use super::documents::{is_semver, sha256_tag, DID_PATH, JWKS_PATH};
use super::jws::{self, RsaKey};
use super::{names, openapi};

/// Why a catalog was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("catalog not found (404)")]
    NotFound,
    #[error("the host asks for credentials ({0})")]
    NeedsCredentials(u16),
    #[error("the host answered {0}")]
    Status(u16),
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("the catalog is not signed (no X-JWS-Signature) and allow_unsigned is false")]
    Unsigned,
    #[error("malformed JWS: {0}")]
    JwsMalformed(String),
    #[error("JWS algorithm `{0}` refused: only RS256")]
    AlgorithmRefused(String),
    #[error("the issuer `{0}` is not the did:web of the catalog's host, `{1}`")]
    IssuerMismatch(String, String),
    #[error("the issuer's did.json names `{0}`")]
    DidMismatch(String),
    #[error("the issuer's keys cannot be had: {0}")]
    KeysUnavailable(String),
    #[error("no key `{0}` among the issuer's keys")]
    UnknownKey(String),
    #[error("the key cannot verify RS256: {0}")]
    KeyUnusable(String),
    #[error("an RSA key of {0} bits: at least 2048 are required")]
    WeakKey(usize),
    #[error("the signature does not verify")]
    BadSignature,
    #[error("catalog_hash does not match the catalog")]
    CatalogHash,
    #[error("the signature has expired")]
    Expired,
    #[error("the signature is not valid yet (iat in the future)")]
    NotYetValid,
    #[error("the catalog is invalid: {0}")]
    Catalog(String),
}

impl DiscoveryError {
    /// A short name for logs and metrics.
    pub fn reason(&self) -> &'static str {
        use DiscoveryError::*;
        match self {
            NotFound => "not_found",
            NeedsCredentials(_) => "needs_credentials",
            Status(_) => "status",
            Unreachable(_) => "unreachable",
            Unsigned => "unsigned",
            JwsMalformed(_) => "jws_malformed",
            AlgorithmRefused(_) => "algorithm_refused",
            IssuerMismatch(..) => "issuer_mismatch",
            DidMismatch(_) => "did_mismatch",
            KeysUnavailable(_) => "keys_unavailable",
            UnknownKey(_) => "unknown_key",
            KeyUnusable(_) => "key_unusable",
            WeakKey(_) => "weak_key",
            BadSignature => "bad_signature",
            CatalogHash => "catalog_hash",
            Expired => "expired",
            NotYetValid => "not_yet_valid",
            Catalog(_) => "catalog_invalid",
        }
    }

    /// Whether asking again later may help (the last verified catalog is kept meanwhile).
    pub fn transient(&self) -> bool {
        matches!(self, DiscoveryError::Unreachable(_))
            || matches!(self, DiscoveryError::Status(s) if *s >= 500)
    }
}

/// One answer of the catalog's host.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// GETs on the catalog's origin (`path` is absolute: `/.well-known/api-catalog`).
pub trait Fetch {
    fn get(
        &self,
        path: &str,
        if_none_match: Option<&str>,
    ) -> impl Future<Output = Result<Fetched, DiscoveryError>> + Send;
}

/// What a discovery is asked to do.
#[derive(Debug, Clone)]
pub struct Request {
    /// `https://host[:port]` of the catalog, lowercase, no trailing `/`.
    pub origin: String,
    /// Path (and query) of the catalog.
    pub path: String,
    pub allow_unsigned: bool,
    /// Only tools with one of these `x-mcp-tool.capabilities` (`*`: any).
    pub capabilities: Vec<String>,
    /// Only `server_url`s on the catalog's origin.
    pub same_origin: bool,
    pub skew_s: u64,
}

/// A tool the catalog proved.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The tool's own name (its `operationId`).
    pub name: String,
    pub description: String,
    pub version: Option<String>,
    pub input: Value,
    pub output: Option<Value>,
    pub server_url: String,
    pub capabilities: Vec<String>,
}

/// A catalog that proved itself, and how long it may be used.
#[derive(Debug, Clone)]
pub struct Verified {
    pub tools: Vec<Tool>,
    /// Tools of the catalog not taken, with why.
    pub refused: Vec<(String, String)>,
    pub etag: Option<String>,
    /// Until when it may be used without asking again (Unix seconds).
    pub fresh_until: u64,
    /// When its signature expires (Unix seconds); the end of its use whatever happens.
    pub exp: u64,
    pub signed: bool,
}

/// What came of asking.
#[derive(Debug)]
pub enum Outcome {
    /// A new catalog, verified.
    New(Verified),
    /// 304: the one held is still it, fresh until then.
    Unchanged { fresh_until: u64 },
}

/// `did:web:` of an origin (`https://host:port` → `did:web:host%3Aport`).
pub fn did_of(origin: &str) -> String {
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .unwrap_or(origin);
    format!(
        "did:web:{}",
        authority.to_ascii_lowercase().replace(':', "%3A")
    )
}

/// Tries of a catalog whose host fails (5xx, unreachable), and the first pause between.
pub const TRIES: u32 = 3;
pub const FIRST_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// The longest one discovery (the catalog, its signature's keys and every tool's spec, the
/// tries included) may take; past it the source keeps what it held, as when its host is
/// unreachable. The outbound role's discovery waits for every source.
pub const DISCOVERY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// [`discover`], tried again after a server error or an unreachable host, [`TRIES`] times
/// in all, the pause doubling from [`FIRST_PAUSE`] with up to half of it again at random;
/// all of it within [`DISCOVERY_DEADLINE`].
pub async fn ask<F: Fetch>(
    f: &F,
    req: &Request,
    held: Option<&Verified>,
    now: u64,
) -> Result<Outcome, DiscoveryError> {
    match tokio::time::timeout(DISCOVERY_DEADLINE, tries(f, req, held, now)).await {
        Ok(result) => result,
        Err(_) => Err(DiscoveryError::Unreachable(format!(
            "not discovered within {} s",
            DISCOVERY_DEADLINE.as_secs()
        ))),
    }
}

/// [`ask`]'s tries.
async fn tries<F: Fetch>(
    f: &F,
    req: &Request,
    held: Option<&Verified>,
    now: u64,
) -> Result<Outcome, DiscoveryError> {
    let mut pause = FIRST_PAUSE;
    let mut result = discover(f, req, held, now).await;
    for _ in 1..TRIES {
        match &result {
            Err(e) if e.transient() => {
                let half = pause.as_millis() as u64 / 2;
                let jitter = rand::random::<u64>() % (half + 1);
                tokio::time::sleep(pause + std::time::Duration::from_millis(jitter)).await;
                pause *= 2;
                result = discover(f, req, held, now).await;
            }
            _ => break,
        }
    }
    result
}

/// What is held after asking: a new catalog replaces it; a 304 makes it fresh again; when
/// the host still fails it is kept while its signature lasts; any other failure drops it.
/// Each case is logged with the source `id`.
pub fn settle(
    held: &mut Option<Verified>,
    result: Result<Outcome, DiscoveryError>,
    now: u64,
    id: &str,
    url: &str,
) {
    match result {
        Ok(Outcome::New(v)) => {
            let names: Vec<&str> = v.tools.iter().map(|t| t.name.as_str()).collect();
            tracing::info!(
                "eat_catalog_verified source={id} url={url} signed={} tools={names:?} exp={}",
                v.signed,
                v.exp
            );
            for (name, why) in &v.refused {
                tracing::warn!("eat_tool_refused source={id} tool={name:?} reason={why}");
            }
            *held = Some(v);
        }
        Ok(Outcome::Unchanged { fresh_until }) => {
            if let Some(h) = held.as_mut() {
                h.fresh_until = fresh_until;
            }
        }
        Err(e) if e.transient() && held.as_ref().is_some_and(|h| h.exp > now) => {
            tracing::warn!(
                "eat_catalog_kept source={id} url={url} reason={} error={e}: the last verified \
                 catalog serves until its signature expires",
                e.reason()
            );
        }
        Err(e) => {
            tracing::warn!(
                "eat_catalog_refused source={id} url={url} reason={} error={e}",
                e.reason()
            );
            *held = None;
        }
    }
}

/// `max-age` of `Cache-Control` (0 with `no-cache` or `no-store`, or when absent).
pub fn max_age(headers: &http::HeaderMap) -> u64 {
    let mut age = 0;
    for v in headers.get_all(http::header::CACHE_CONTROL) {
        for d in v.to_str().unwrap_or_default().split(',') {
            let d = d.trim().to_ascii_lowercase();
            if d == "no-cache" || d == "no-store" {
                return 0;
            }
            if let Some(n) = d.strip_prefix("max-age=") {
                age = n.trim_matches('"').parse().unwrap_or(0);
            }
        }
    }
    age
}

fn status_error(status: u16) -> DiscoveryError {
    match status {
        404 | 410 => DiscoveryError::NotFound,
        401 | 403 => DiscoveryError::NeedsCredentials(status),
        s => DiscoveryError::Status(s),
    }
}

/// Fetch and verify the catalog; `held` is the catalog verified before, revalidated with its
/// ETag while its signature lasts.
pub async fn discover<F: Fetch>(
    f: &F,
    req: &Request,
    held: Option<&Verified>,
    now: u64,
) -> Result<Outcome, DiscoveryError> {
    let etag = held.filter(|h| h.exp > now).and_then(|h| h.etag.as_deref());
    let answer = f.get(&req.path, etag).await?;
    if answer.status == 304 {
        if let Some(h) = held.filter(|_| etag.is_some()) {
            let fresh_until = now.saturating_add(max_age(&answer.headers)).min(h.exp);
            return Ok(Outcome::Unchanged { fresh_until });
        }
    }
    if answer.status != 200 {
        return Err(status_error(answer.status));
    }
    let signature = answer
        .headers
        .get("x-jws-signature")
        .map(|v| {
            v.to_str()
                .map_err(|_| DiscoveryError::JwsMalformed("not ASCII".into()))
        })
        .transpose()?;
    let exp = match signature {
        Some(jws) => verify_signature(f, req, jws, &answer.body, now).await?,
        None if req.allow_unsigned => {
            tracing::warn!("eat_catalog_unsigned url={}{}", req.origin, req.path);
            now.saturating_add(max_age(&answer.headers))
        }
        None => return Err(DiscoveryError::Unsigned),
    };
    let catalog = super::validate::validate(&answer.body).map_err(|errors| {
        let shown: Vec<String> = errors.iter().take(5).map(|e| e.to_string()).collect();
        DiscoveryError::Catalog(shown.join("; "))
    })?;
    let (tools, refused) = take_tools(f, req, &catalog).await;
    Ok(Outcome::New(Verified {
        tools,
        refused,
        etag: answer
            .headers
            .get(http::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        fresh_until: now.saturating_add(max_age(&answer.headers)).min(exp),
        exp,
        signed: signature.is_some(),
    }))
}

/// Steps 1 to 5 of the text's Verification Process; the signature's `exp`.
async fn verify_signature<F: Fetch>(
    f: &F,
    req: &Request,
    jws: &str,
    body: &[u8],
    now: u64,
) -> Result<u64, DiscoveryError> {
    let parsed = jws::parse(jws)?;
    let did = did_of(&req.origin);
    if parsed.claims.iss != did {
        return Err(DiscoveryError::IssuerMismatch(
            parsed.claims.iss.chars().take(128).collect(),
            did,
        ));
    }
    let jwk = issuer_key(f, &did, &parsed.kid).await?;
    RsaKey::from_jwk(&jwk)?.verify(&parsed)?;
    // The hash of the canonical form; carapace serves that form, others may not.
    let doc: Value = serde_json::from_slice(body)
        .map_err(|e| DiscoveryError::Catalog(format!("not JSON: {e}")))?;
    let canonical = carapace_filters::canonical::jcs_string(&doc)
        .map_err(|e| DiscoveryError::Catalog(format!("no canonical form: {e}")))?;
    if sha256_tag(canonical.as_bytes()) != parsed.claims.catalog_hash {
        return Err(DiscoveryError::CatalogHash);
    }
    jws::check_times(&parsed.claims, now, req.skew_s)?;
    Ok(parsed.claims.exp)
}

/// The issuer's key `kid`: from its did:web document; only when that cannot be had, from
/// its JWKS. A did.json that names another DID is refused, not passed over.
async fn issuer_key<F: Fetch>(f: &F, did: &str, kid: &str) -> Result<Value, DiscoveryError> {
    let unknown = || DiscoveryError::UnknownKey(kid.chars().take(128).collect());
    let resolved = match f.get(DID_PATH, None).await {
        Ok(a) if a.status == 200 => serde_json::from_slice::<Value>(&a.body).ok(),
        _ => None,
    };
    if let Some(doc) = resolved {
        let id = doc.get("id").and_then(Value::as_str).unwrap_or_default();
        if id != did {
            return Err(DiscoveryError::DidMismatch(id.chars().take(128).collect()));
        }
        let wanted = format!("{did}#{kid}");
        let methods = doc.get("verificationMethod").and_then(Value::as_array);
        let method = methods.into_iter().flatten().find(|m| {
            let jwk = &m["publicKeyJwk"];
            (m["id"] == wanted.as_str() || jwk["kid"] == kid)
                && m.get("controller").is_none_or(|c| c == did)
        });
        return method
            .and_then(|m| m.get("publicKeyJwk").cloned())
            .ok_or_else(unknown);
    }
    let jwks = match f.get(JWKS_PATH, None).await {
        Ok(a) if a.status == 200 => serde_json::from_slice::<Value>(&a.body)
            .map_err(|_| DiscoveryError::KeysUnavailable("jwks.json is not JSON".into()))?,
        Ok(a) => {
            return Err(DiscoveryError::KeysUnavailable(format!(
                "no did.json, and jwks.json answered {}",
                a.status
            )))
        }
        Err(e) => return Err(DiscoveryError::KeysUnavailable(e.to_string())),
    };
    jwks.get("keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|k| k["kid"] == kid)
        .cloned()
        .ok_or_else(unknown)
}

/// The catalog's tools that match the capabilities, each with its OpenAPI document checked;
/// the others with why.
/// Most tools taken from one catalog: each may cost a fetch of its spec, and the outbound
/// role's discovery waits for every source.
pub const MAX_TOOLS_PER_CATALOG: usize = 1024;

async fn take_tools<F: Fetch>(
    f: &F,
    req: &Request,
    catalog: &Value,
) -> (Vec<Tool>, Vec<(String, String)>) {
    let (mut tools, mut refused) = (Vec::new(), Vec::new());
    for entry in catalog["tools"].as_array().into_iter().flatten() {
        let name = entry["name"].as_str().unwrap_or_default().to_owned();
        if name.chars().any(char::is_control) {
            refused.push((name, "a control character in the name".into()));
            continue;
        }
        if tools.len() + refused.len() >= MAX_TOOLS_PER_CATALOG {
            refused.push((
                name,
                format!("beyond the {MAX_TOOLS_PER_CATALOG} tools taken"),
            ));
            continue;
        }
        let caps: Vec<String> = entry["x-mcp-tool"]["capabilities"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str().map(str::to_owned))
            .collect();
        let wanted = req
            .capabilities
            .iter()
            .any(|c| c == "*" || caps.contains(c));
        if !wanted {
            continue;
        }
        match take_tool(f, req, entry, caps).await {
            Ok(t) => tools.push(t),
            Err(why) => refused.push((name, why)),
        }
    }
    (tools, refused)
}

async fn take_tool<F: Fetch>(
    f: &F,
    req: &Request,
    entry: &Value,
    capabilities: Vec<String>,
) -> Result<Tool, String> {
    let server_url = entry["x-mcp-tool"]["server_url"]
        .as_str()
        .unwrap_or_default();
    let server: http::Uri = server_url
        .parse()
        .map_err(|_| format!("server_url `{server_url}` is not a URL"))?;
    if server.scheme_str() != Some("https") {
        return Err(format!("server_url `{server_url}` is not https"));
    }
    if req.same_origin && origin_of(&server) != req.origin {
        return Err(format!(
            "server_url `{server_url}` is not on the catalog's origin"
        ));
    }
    let spec_hash = entry["spec_hash"]
        .as_str()
        .ok_or("no spec_hash: its OpenAPI document cannot be checked")?;
    let spec_url = entry["spec_url"].as_str().unwrap_or_default();
    let spec_uri: http::Uri = spec_url
        .parse()
        .map_err(|_| format!("spec_url `{spec_url}` is not a URL"))?;
    if origin_of(&spec_uri) != req.origin {
        return Err(format!(
            "spec_url `{spec_url}` is not on the catalog's origin"
        ));
    }
    let path = spec_uri.path_and_query().map_or("/", |p| p.as_str());
    let spec = f
        .get(path, None)
        .await
        .map_err(|e| format!("spec_url: {e}"))?;
    if spec.status != 200 {
        return Err(format!("spec_url answered {}", spec.status));
    }
    if sha256_tag(&spec.body) != spec_hash {
        return Err("its OpenAPI document does not match spec_hash".into());
    }
    let doc: Value =
        serde_json::from_slice(&spec.body).map_err(|_| "its OpenAPI document is not JSON")?;
    let op = openapi::operation(&doc)?;
    let name = entry["name"].as_str().unwrap_or_default();
    if names::decode(name).as_deref() != Some(op.operation_id.as_str()) && name != op.operation_id {
        return Err(format!(
            "operationId `{}` is not the tool named `{name}`",
            op.operation_id
        ));
    }
    Ok(Tool {
        name: op.operation_id,
        description: entry["description"].as_str().unwrap_or_default().to_owned(),
        version: entry["version"]
            .as_str()
            .filter(|v| is_semver(v))
            .map(str::to_owned),
        input: op.input,
        output: op.output,
        server_url: server_url.to_owned(),
        capabilities,
    })
}

/// `scheme://host[:port]` of `uri`, lowercase; the default port is left out.
pub fn origin_of(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or_default().to_ascii_lowercase();
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    match uri.port_u16() {
        Some(443) if scheme == "https" => format!("{scheme}://{host}"),
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    }
}

#[cfg(test)]
mod tests;
