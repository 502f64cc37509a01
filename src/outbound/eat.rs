//! EAT catalogs as a source of the outbound role (`outbound.eat.<id>`): each is discovered
//! and verified ([`crate::eat::discover`]), kept per its cache headers but never past its
//! signature, revalidated with its ETag, retried with backoff on a server error (keeping
//! the last verified catalog meanwhile); its tools are called with MCP at the `server_url`
//! the verified catalog names, and at no other.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use carapace_filters::call::{CallOutcome, ToolCall, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use carapace_filters::Rejection;
use http::Method;
use tower::ServiceExt;

use super::OutboundError;
use crate::config::{Loaded, OutboundEatConfig};
use crate::eat::discover::{self, origin_of, DiscoveryError, Fetch, Fetched, Verified};
use crate::mcp::back::http::HttpServer;
use crate::mcp::back::upstream::Notices;
use crate::mcp::back::{McpBack, McpUpstream};
use crate::upstream::AppClient;

/// Longest wait for one document.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// One configured catalog.
pub(super) struct EatSource {
    id: String,
    request: discover::Request,
    /// The catalog's origin.
    client: AppClient,
    tls: Arc<rustls::ClientConfig>,
    pool: crate::config::PoolConfig,
    max_response_bytes: u64,
    timeouts: (u64, u64),
    held: Mutex<Option<Verified>>,
    /// Why the last discovery failed (`None` after one that succeeded).
    refusal: Mutex<Option<DiscoveryError>>,
    /// The MCP servers the verified catalog names, by `server_url`.
    servers: Mutex<HashMap<String, Arc<McpUpstream>>>,
}

/// GETs on the catalog's origin through its client.
struct Origin<'a>(&'a AppClient);

impl Fetch for Origin<'_> {
    async fn get(&self, path: &str, inm: Option<&str>) -> Result<Fetched, DiscoveryError> {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("application/json"),
        );
        if let Some(tag) = inm.and_then(|t| http::HeaderValue::from_str(t).ok()) {
            headers.insert(http::header::IF_NONE_MATCH, tag);
        }
        let sent = self.0.send(Method::GET, path, headers, Bytes::new());
        match tokio::time::timeout(FETCH_TIMEOUT, sent).await {
            Ok(Ok(r)) => Ok(Fetched {
                status: r.status.as_u16(),
                headers: r.headers,
                body: r.body,
            }),
            Ok(Err(e)) => Err(DiscoveryError::Unreachable(e.to_string())),
            Err(_) => Err(DiscoveryError::Unreachable(format!(
                "no answer within {} s",
                FETCH_TIMEOUT.as_secs()
            ))),
        }
    }
}

/// TLS to the catalog's host: its CA (else the web roots), and a client certificate when
/// configured.
fn client_tls(e: &OutboundEatConfig) -> Result<Arc<rustls::ClientConfig>, OutboundError> {
    let fail = |m: String| OutboundError(m);
    let mut roots = rustls::RootCertStore::empty();
    match &e.ca_file {
        Some(ca) => {
            for c in crate::tls::load_certs(ca).map_err(|x| fail(x.to_string()))? {
                roots.add(c).map_err(|x| fail(x.to_string()))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|x| fail(x.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&e.cert_file, &e.key_file) {
        (Some(c), Some(k)) => builder
            .with_client_auth_cert(
                crate::tls::load_certs(c).map_err(|x| fail(x.to_string()))?,
                crate::tls::load_key(k).map_err(|x| fail(x.to_string()))?,
            )
            .map_err(|x| fail(x.to_string()))?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `host` and port of an https URI.
fn host_port(uri: &http::Uri) -> Option<(String, u16)> {
    let host = uri.host()?.trim_matches(['[', ']']).to_owned();
    Some((host, uri.port_u16().unwrap_or(443)))
}

/// The configured catalogs, by id.
pub(super) fn eat_sources(cfg: &Loaded) -> Result<BTreeMap<String, EatSource>, OutboundError> {
    let mut sources = BTreeMap::new();
    let outbound = cfg.config.outbound.as_ref();
    for (id, e) in outbound.map(|o| &o.eat).into_iter().flatten() {
        let url: http::Uri = e
            .url
            .parse()
            .map_err(|_| OutboundError(format!("eat {id}: url")))?;
        let (host, port) =
            host_port(&url).ok_or_else(|| OutboundError(format!("eat {id}: url has no host")))?;
        let tls = client_tls(e)?;
        let pool = cfg.config.app.pool.clone();
        let max = cfg.config.limits.max_response_bytes;
        let client = AppClient::named(&host, port, tls.clone(), &pool, max);
        let request = discover::Request {
            origin: origin_of(&url),
            path: url.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
            allow_unsigned: e.allow_unsigned,
            capabilities: e.capabilities.clone(),
            same_origin: e.same_origin,
            skew_s: e.clock_skew_s,
        };
        sources.insert(
            id.clone(),
            EatSource {
                id: id.clone(),
                request,
                client,
                tls,
                pool,
                max_response_bytes: max,
                timeouts: (e.timeout_ms_default, e.timeout_ms_max),
                held: Mutex::new(None),
                refusal: Mutex::new(None),
                servers: Mutex::new(HashMap::new()),
            },
        );
    }
    Ok(sources)
}

impl EatSource {
    fn held(&self) -> std::sync::MutexGuard<'_, Option<Verified>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tools of the catalog, discovering it again once what is held is stale.
    /// The `x-mcp-tool.capabilities` of each tool of the verified catalog (search tags).
    pub(super) fn capabilities(&self) -> HashMap<String, Vec<String>> {
        let held = self.held();
        held.iter()
            .flat_map(|v| &v.tools)
            .map(|t| (t.name.clone(), t.capabilities.clone()))
            .collect()
    }

    pub(super) async fn tools(&self, now: u64) -> BTreeMap<String, Arc<ToolSpec>> {
        let stale = self.held().as_ref().is_none_or(|h| h.fresh_until <= now);
        if stale {
            self.refresh(now).await;
        }
        let held = self.held();
        let Some(v) = held.as_ref().filter(|v| v.exp > now) else {
            return BTreeMap::new();
        };
        let mut tools = BTreeMap::new();
        for t in &v.tools {
            match self.compile(t) {
                Ok(spec) => {
                    tools.insert(t.name.clone(), Arc::new(spec));
                }
                Err(e) => tracing::warn!(
                    "eat_tool_refused source={} tool={} reason={e}",
                    self.id,
                    t.name
                ),
            }
        }
        tools
    }

    fn compile(&self, t: &discover::Tool) -> Result<ToolSpec, String> {
        let input = CompiledSchema::compile(t.input.clone()).map_err(|e| e.0)?;
        let output = match &t.output {
            Some(o) => Some(CompiledSchema::compile(o.clone()).map_err(|e| e.0)?),
            None => None,
        };
        Ok(ToolSpec {
            name: t.name.clone(),
            app_name: None,
            definition: None,
            description: t.description.clone(),
            input,
            output,
            timeout_ms_default: self.timeouts.0,
            timeout_ms_max: self.timeouts.1,
            idempotent: false,
            side_effects: false,
        })
    }

    /// Ask the host again ([`discover::ask`], bounded as a whole) and settle what is held
    /// ([`discover::settle`]).
    async fn refresh(&self, now: u64) {
        let held = self.held().clone();
        let result = discover::ask(&Origin(&self.client), &self.request, held.as_ref(), now).await;
        *self.refusal.lock().unwrap_or_else(|e| e.into_inner()) = result.as_ref().err().cloned();
        let url = format!("{}{}", self.request.origin, self.request.path);
        discover::settle(&mut self.held(), result, now, &self.id, &url);
    }

    /// Why the last discovery failed, if it did.
    pub(super) fn refusal(&self) -> Option<DiscoveryError> {
        self.refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Call `call` on the MCP server the verified catalog names for its tool.
    pub(super) async fn call(&self, call: ToolCall, now: u64) -> Result<CallOutcome, Rejection> {
        let name = call.tool.app_name().to_owned();
        let server_url = {
            let held = self.held();
            let v = held.as_ref().filter(|v| v.exp > now).ok_or_else(|| {
                Rejection::AppUnavailable(format!(
                    "the catalog of {} is no longer verified",
                    self.id
                ))
            })?;
            v.tools
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.server_url.clone())
                .ok_or_else(|| Rejection::ToolNotFound(name.clone()))?
        };
        let server = self.server(&server_url)?;
        McpBack::new(server).oneshot(call).await
    }

    /// The MCP client of `server_url` (one per URL, kept).
    fn server(&self, server_url: &str) -> Result<Arc<McpUpstream>, Rejection> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = servers.get(server_url) {
            return Ok(s.clone());
        }
        let uri: http::Uri = server_url
            .parse()
            .map_err(|_| Rejection::Internal(format!("server_url {server_url}")))?;
        let (host, port) = host_port(&uri)
            .ok_or_else(|| Rejection::Internal(format!("server_url {server_url}")))?;
        let client = AppClient::named(
            &host,
            port,
            self.tls.clone(),
            &self.pool,
            self.max_response_bytes,
        );
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let notices = Notices::default();
        let http = HttpServer::new(client, path, notices.clone());
        let server = Arc::new(McpUpstream::new(Box::new(http), notices));
        servers.insert(server_url.to_owned(), server.clone());
        Ok(server)
    }
}
