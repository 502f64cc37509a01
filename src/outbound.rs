//! The outbound (gateway) role: the local agent sends plain tools-v1 calls to a Unix socket;
//! carapace routes each by its registry, never by a URL from the caller: tool name → paired
//! peer (discovered from the peers in `outbound.peers`), called over mTLS with the gateway's
//! client certificate and the peer's certificate pinned to its paired record; or capability →
//! skill id → URL (`outbound.skills`), called with a signed Skill Gateway v1 `/run`. Input is
//! validated before sending and output after receiving.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::Method;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::DigitallySignedStruct;
use tower::Service;

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};

use crate::catalog::{tools_v1_catalog, Catalog, CatalogHandle};
use crate::config::Loaded;
use crate::pairing::identity::GatewayIdentity;
use crate::pairing::wire::fingerprints_match;
use crate::peers::PeerStore;
use crate::upstream::AppClient;

/// Accepts a peer's certificate only if it has the fingerprint its paired record named when
/// the client was made (clients are remade when the record changes, see [`Outbound`]).
#[derive(Debug)]
pub struct PinnedPeer {
    component_id: String,
    fingerprint: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedPeer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = crate::tls::fingerprint(end_entity);
        if !fingerprints_match(&seen, &self.fingerprint) {
            return Err(rustls::Error::General(format!(
                "{} presented {seen}, not its paired certificate",
                self.component_id
            )));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Building the outbound role failed.
#[derive(Debug, thiserror::Error)]
#[error("outbound: {0}")]
pub struct OutboundError(String);

/// The peers, their clients and the routes.
pub struct Outbound {
    peers: Arc<PeerStore>,
    addresses: BTreeMap<String, std::net::SocketAddr>,
    /// The gateway's client certificate and key.
    cert: CertificateDer<'static>,
    key_pem: zeroize::Zeroizing<String>,
    pool: crate::config::PoolConfig,
    max_response_bytes: u64,
    /// Per peer: the fingerprint a client was made for, and the client.
    clients: std::sync::Mutex<HashMap<String, (String, AppClient)>>,
    /// Skill Gateway v1 skills, by skill id.
    skills: BTreeMap<String, SkillRoute>,
    /// Tool name → where it is served.
    routes: ArcSwap<HashMap<String, Route>>,
    pub catalog: Arc<CatalogHandle>,
    /// One discovery at a time, so the last to finish is the latest.
    refreshing: tokio::sync::Mutex<()>,
    /// Each peer's last discovery document, persisted in [`KNOWN_TOOLS_FILE`].
    known: KnownTools,
}

/// The file in `state_dir` keeping each peer's last discovery document.
pub const KNOWN_TOOLS_FILE: &str = "outbound_tools.json";

/// How long a pairing's confirmation may take: discovery with the issued certificate is
/// retried this long.
pub const CONFIRM_WINDOW: std::time::Duration = std::time::Duration::from_secs(2);
const CONFIRM_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Each peer's last discovery document, by peer id, kept across restarts: a peer that is
/// revoked, pending or unreachable keeps the tools it last served, so calls to them get the
/// same answer (`FORBIDDEN`, `DEPENDENCY_UNAVAILABLE`) before and after a restart instead of
/// `TOOL_NOT_FOUND` once the process forgot them. A peer without any record loses them.
struct KnownTools {
    path: std::path::PathBuf,
    docs: std::sync::Mutex<BTreeMap<String, serde_json::Value>>,
}

impl KnownTools {
    fn load(path: std::path::PathBuf) -> Self {
        let docs = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!("{}: ignored: {e}", path.display());
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        KnownTools {
            path,
            docs: std::sync::Mutex::new(docs),
        }
    }

    fn get(&self, peer: &str) -> Option<serde_json::Value> {
        let docs = self.docs.lock().unwrap_or_else(|e| e.into_inner());
        docs.get(peer).cloned()
    }

    /// Set (`Some`) or forget (`None`) a peer's document; written only when it changed.
    fn set(&self, peer: &str, doc: Option<serde_json::Value>) {
        let mut docs = self.docs.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match doc {
            Some(d) => docs.insert(peer.to_string(), d.clone()).as_ref() != Some(&d),
            None => docs.remove(peer).is_some(),
        };
        if !changed {
            return;
        }
        let bytes = serde_json::to_vec(&*docs).expect("serializable");
        if let Err(e) = carapace_filters::state_file::write_atomically(&self.path, &bytes) {
            tracing::warn!("{}: {e}", self.path.display());
        }
    }
}

/// Where a tool is served.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// A paired tool host, by component id.
    Peer(String),
    /// A configured skill, by skill id.
    Skill(String),
}

/// A skill the outbound role calls.
struct SkillRoute {
    client: AppClient,
    config: crate::config::SkillAppConfig,
    signing: Option<crate::skill_v1::AppSigning>,
}

impl Outbound {
    /// Clients present a client certificate the gateway's CA issues now.
    pub fn new(
        cfg: &Loaded,
        gateway: &GatewayIdentity,
        peers: Arc<PeerStore>,
    ) -> Result<Self, OutboundError> {
        use rustls_pki_types::pem::PemObject;
        let (cert_pem, key_pem) = gateway
            .issue_client_certificate()
            .map_err(|e| OutboundError(e.to_string()))?;
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| OutboundError(e.to_string()))?;
        let skills = skill_routes(cfg)?;
        let outbound = Outbound {
            skills,
            peers,
            addresses: cfg.outbound_peers.clone(),
            cert,
            key_pem: zeroize::Zeroizing::new(key_pem),
            pool: cfg.config.app.pool.clone(),
            max_response_bytes: cfg.config.limits.max_response_bytes,
            clients: std::sync::Mutex::new(HashMap::new()),
            routes: ArcSwap::from_pointee(HashMap::new()),
            catalog: Arc::new(CatalogHandle::default()),
            refreshing: tokio::sync::Mutex::new(()),
            known: KnownTools::load(cfg.config.state_dir.join(KNOWN_TOOLS_FILE)),
        };
        outbound.restore_known(cfg);
        Ok(outbound)
    }

    /// Whether `peer` is one this gateway calls (it has an address in `outbound.peers`).
    pub fn dials(&self, peer: &str) -> bool {
        self.addresses.contains_key(peer)
    }

    /// Confirm a pairing: `GET /v1/tools` on `peer` with the certificate just issued to it
    /// pinned, retried for up to `window` until it answers a tools-v1 discovery. Only a peer
    /// that activated the pairing can: it serves that certificate and trusts the gateway.
    pub async fn confirm(
        &self,
        peer: &str,
        fingerprint: &str,
        window: std::time::Duration,
    ) -> Result<(), String> {
        let client = self
            .pinned_client(peer, fingerprint)
            .map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + window;
        loop {
            let why = match discover(&client).await {
                Ok(_) => return Ok(()),
                Err(why) => why,
            };
            if tokio::time::Instant::now() + CONFIRM_RETRY >= deadline {
                return Err(why);
            }
            tokio::time::sleep(CONFIRM_RETRY).await;
        }
    }

    /// The client for `peer`, pinned to the certificate of its active paired record: checked
    /// before every call, so a revoked peer is refused before any I/O, and a re-paired one
    /// gets a new client (its old pooled connections are dropped).
    fn client_for(&self, peer: &str) -> Result<AppClient, Rejection> {
        let record = self
            .peers
            .active(peer)
            .filter(|r| r.component_type == "tool_host" && !r.mtls_cert_fingerprint.is_empty())
            .ok_or_else(|| {
                // One answer for one state, whenever it is asked.
                let status = self.peers.status_of(peer);
                Rejection::Forbidden(format!(
                    "peer {peer} is {}",
                    status.as_deref().unwrap_or("not paired")
                ))
            })?;
        self.pinned_client(peer, &record.mtls_cert_fingerprint)
    }

    /// A client for `peer` that accepts only the certificate with `fingerprint` (one per
    /// peer, remade when the fingerprint changes).
    fn pinned_client(&self, peer: &str, fingerprint: &str) -> Result<AppClient, Rejection> {
        use rustls_pki_types::pem::PemObject;
        let address = *self
            .addresses
            .get(peer)
            .ok_or_else(|| Rejection::Internal(format!("no address for {peer}")))?;
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((fp, client)) = clients.get(peer) {
            if fingerprints_match(fp, fingerprint) {
                return Ok(client.clone());
            }
        }
        let internal = |e: String| Rejection::Internal(format!("client for {peer}: {e}"));
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| internal(e.to_string()))?;
        let provider = crate::tls::provider();
        let verifier = Arc::new(PinnedPeer {
            component_id: peer.to_string(),
            fingerprint: fingerprint.to_string(),
            provider: provider.clone(),
        });
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| internal(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(vec![self.cert.clone()], key)
            .map_err(|e| internal(e.to_string()))?;
        let client = AppClient::mtls(
            address,
            Arc::new(config),
            &self.pool,
            self.max_response_bytes,
        );
        clients.insert(peer.to_string(), (fingerprint.to_string(), client.clone()));
        Ok(client)
    }

    /// Ask every paired peer for its tools and swap in the merged registry; a peer that is
    /// not paired (revoked, pending) or cannot be reached keeps the tools it last served (see
    /// [`KnownTools`]), so calls to them are refused the same way whenever they come. A tool
    /// served by two peers goes to the first (by id). One refresh runs at a time.
    pub async fn refresh(&self, cfg: &Loaded) -> usize {
        let _one_at_a_time = self.refreshing.lock().await;
        let mut merged = Catalog::default();
        let mut routes = HashMap::new();
        for id in self.addresses.keys() {
            if let Some(doc) = self.peer_tools(id).await {
                add_peer_tools(id, &doc, cfg, &mut merged, &mut routes);
            }
        }
        // Skills: capability -> skill_id -> url.
        for (id, skill) in &self.skills {
            tracing::info!(
                "manifest_discovery_start skill_id={id} base_url={}",
                skill.client.base_url()
            );
            let answer = skill
                .client
                .send(
                    Method::GET,
                    "/manifest",
                    http::HeaderMap::new(),
                    Bytes::new(),
                )
                .await;
            let doc: Option<serde_json::Value> = match answer {
                Ok(r) if r.status.is_success() => serde_json::from_slice(&r.body).ok(),
                Ok(r) => {
                    tracing::warn!("skill_skipped skill_id={id} reason=MANIFEST_INVALID");
                    tracing::warn!("MANIFEST_INVALID: GET /manifest returned {}", r.status);
                    None
                }
                Err(e) => {
                    tracing::warn!("skill_skipped skill_id={id} reason=DEPENDENCY_UNAVAILABLE");
                    tracing::warn!("DEPENDENCY_UNAVAILABLE: {e}");
                    None
                }
            };
            let Some(doc) = doc else { continue };
            match crate::catalog::skill_catalog(&doc, &skill.config, cfg) {
                Ok(c) => {
                    for (name, spec) in c.tools {
                        if merged.tools.contains_key(&name) {
                            tracing::warn!("outbound_tool_duplicate tool={name} skill={id}");
                            continue;
                        }
                        routes.insert(name.clone(), Route::Skill(id.clone()));
                        merged.tools.insert(name, spec);
                    }
                }
                Err(e) => {
                    let reason = e.to_string();
                    let reason = reason.split(':').next().unwrap_or_default().to_string();
                    tracing::warn!("skill_skipped skill_id={id} reason={reason}");
                    tracing::warn!("{e}");
                }
            }
        }
        let n = merged.tools.len();
        merged.service = "carapace-outbound".into();
        self.routes.store(Arc::new(routes));
        self.catalog.replace(merged);
        n
    }
}

/// The configured Skill Gateway v1 skills, by skill id, with their clients and signing.
fn skill_routes(cfg: &Loaded) -> Result<BTreeMap<String, SkillRoute>, OutboundError> {
    let mut skills = BTreeMap::new();
    let outbound = cfg.config.outbound.as_ref();
    for (id, skill) in outbound.map(|o| &o.skills).into_iter().flatten() {
        let at = &cfg.outbound_skills[id];
        let client = match &at.ca_file {
            None => AppClient::new(
                crate::config::AppAddress::Tcp(at.address),
                &cfg.config.app.pool,
                cfg.config.limits.max_response_bytes,
            ),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in crate::tls::load_certs(ca).map_err(|e| OutboundError(e.to_string()))? {
                    roots.add(c).map_err(|e| OutboundError(e.to_string()))?;
                }
                let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map_err(|e| OutboundError(e.to_string()))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                AppClient::mtls(
                    at.address,
                    Arc::new(config),
                    &cfg.config.app.pool,
                    cfg.config.limits.max_response_bytes,
                )
            }
        };
        let signing = match (&skill.auth, &at.secret) {
            (Some(auth), Some(secret)) => Some(crate::skill_v1::AppSigning {
                mode: match auth.mode {
                    crate::config::AuthModeConfig::Hmac => {
                        carapace_filters::signature::AuthMode::Hmac
                    }
                    crate::config::AuthModeConfig::ApiKey => {
                        carapace_filters::signature::AuthMode::ApiKey
                    }
                },
                header: auth
                    .header_name
                    .as_deref()
                    .map(|h| http::HeaderName::from_bytes(h.as_bytes()).expect("validated")),
                secret: secret.clone(),
            }),
            _ => None,
        };
        let config = crate::config::SkillAppConfig {
            skill_id: id.clone(),
            capabilities: skill.capabilities.clone(),
            auth: skill.auth.clone(),
            protocol_version: skill.protocol_version.clone(),
            timeout_ms_default: skill.timeout_ms_default,
            timeout_ms_max: skill.timeout_ms_max,
        };
        skills.insert(
            id.clone(),
            SkillRoute {
                client,
                config,
                signing,
            },
        );
    }
    Ok(skills)
}

/// Add the tools of peer `id`'s discovery document to `merged`, routed to it; a tool
/// already there stays with its peer.
fn add_peer_tools(
    id: &str,
    doc: &serde_json::Value,
    cfg: &Loaded,
    merged: &mut Catalog,
    routes: &mut HashMap<String, Route>,
) {
    match tools_v1_catalog(doc, cfg) {
        Ok(c) => {
            for (name, spec) in c.tools {
                if merged.tools.contains_key(&name) {
                    tracing::warn!("outbound_tool_duplicate tool={name} peer={id}");
                    continue;
                }
                routes.insert(name.clone(), Route::Peer(id.to_string()));
                merged.tools.insert(name, spec);
            }
        }
        Err(e) => tracing::warn!("outbound_discovery_failed peer={id} reason={e}"),
    }
}

/// `GET /v1/tools` on a peer: its discovery document, or why not.
async fn discover(client: &AppClient) -> Result<serde_json::Value, String> {
    let r = client
        .send(
            Method::GET,
            "/v1/tools",
            http::HeaderMap::new(),
            Bytes::new(),
        )
        .await
        .map_err(|e| e.to_string())?;
    if !r.status.is_success() {
        return Err(format!("GET /v1/tools answered {}", r.status));
    }
    let doc: serde_json::Value = serde_json::from_slice(&r.body)
        .map_err(|e| format!("GET /v1/tools answer is not JSON: {e}"))?;
    if doc["version"] != "v1" || !doc["tools"].is_array() {
        return Err("GET /v1/tools answer is not a tools-v1 discovery".into());
    }
    Ok(doc)
}

impl Outbound {
    /// Before the first discovery: route the tools each peer with a record last served, so
    /// a restart changes no answer (a revoked peer's tools stay refused with `FORBIDDEN`).
    fn restore_known(&self, cfg: &Loaded) {
        let mut merged = Catalog::default();
        let mut routes = HashMap::new();
        for id in self.addresses.keys() {
            if self.peers.status_of(id).is_none() {
                continue;
            }
            if let Some(doc) = self.known.get(id) {
                add_peer_tools(id, &doc, cfg, &mut merged, &mut routes);
            }
        }
        if routes.is_empty() {
            return;
        }
        merged.service = "carapace-outbound".into();
        self.routes.store(Arc::new(routes));
        self.catalog.replace(merged);
    }

    /// The tools document of peer `id`: asked of it when it is paired and remembered; the
    /// remembered one when it is not paired or does not answer; none once it has no record.
    async fn peer_tools(&self, id: &str) -> Option<serde_json::Value> {
        let client = match self.client_for(id) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("outbound_discovery_skipped peer={id} reason={e}");
                if self.peers.status_of(id).is_none() {
                    self.known.set(id, None);
                }
                return self.known.get(id);
            }
        };
        match discover(&client).await {
            Ok(doc) => {
                self.known.set(id, Some(doc.clone()));
                Some(doc)
            }
            Err(e) => {
                tracing::warn!("outbound_discovery_failed peer={id} reason={e}");
                self.known.get(id)
            }
        }
    }
}

/// Call a paired tool host with `call` and decode its answer.
async fn call_peer(client: &AppClient, call: &ToolCall) -> Result<CallOutcome, Rejection> {
    let body = serde_json::to_vec(&crate::tools_v1::encode_request(call)).expect("serializes");
    let mut headers = http::HeaderMap::new();
    carapace_filters::call::set_call_headers(&mut headers, call);
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let resp = client
        .send(Method::POST, "/v1/tools/call", headers, Bytes::from(body))
        .await?;
    decode_peer_answer(resp.status, &resp.body, call)
}

/// A tool host's answer, in either style of a tools-v1 host: every outcome as HTTP 200 with
/// the envelope (crabstack), or an error outcome as an HTTP error status with the envelope
/// (carapace). A refusal or error of the host reaches the caller as the host said it (code,
/// message, details, and `retryable` only for `status: retryable_error`); an answer that is
/// no envelope (crabstack's plain-text 400/404/405) stays `DEPENDENCY_UNAVAILABLE`.
fn decode_peer_answer(
    status: http::StatusCode,
    body: &[u8],
    call: &ToolCall,
) -> Result<CallOutcome, Rejection> {
    let refusal = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|doc| peer_error(&doc, call));
    match refusal {
        Some(outcome) => outcome,
        // Successes (and anything else) as any tools-v1 answer: schema, call id, status.
        None => crate::tools_v1::decode_response(status, body, call),
    }
}

/// The outcome an error envelope (`status` `error`, `retryable_error` or `timeout` with an
/// `error.code`) stands for; `None` if `doc` is not one. The call id and tool name may be
/// empty (a host refuses some requests before reading them) but not another call's.
fn peer_error(doc: &serde_json::Value, call: &ToolCall) -> Option<Result<CallOutcome, Rejection>> {
    let status = doc.get("status")?.as_str()?;
    if !matches!(status, "error" | "retryable_error" | "timeout") {
        return None;
    }
    let error = doc.get("error")?;
    let code = error.get("code")?.as_str()?;
    let other = |key: &str, ours: &str| {
        doc.get(key)
            .and_then(serde_json::Value::as_str)
            .is_some_and(|v| !v.is_empty() && v != ours)
    };
    if other("call_id", &call.call_id) || other("tool_name", &call.tool.name) {
        return Some(Err(Rejection::AppInvalid(
            "answer is for another call_id or tool".into(),
        )));
    }
    if status == "timeout" {
        let ms = call.tool.effective_timeout(call.timeout_ms).as_millis() as u64;
        return Some(Err(Rejection::Timeout(ms)));
    }
    let valid_code = (1..=64).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    let message = error.get("message").and_then(serde_json::Value::as_str);
    Some(Ok(CallOutcome::AppError {
        code: if valid_code { code } else { "INTERNAL" }.to_string(),
        message: message.unwrap_or_default().chars().take(2048).collect(),
        details: error.get("details").filter(|d| d.is_object()).cloned(),
        // Only this status allows a retry; `error.retryable` is advice.
        retryable: status == "retryable_error",
    }))
}

/// The back of the outbound stack: call the peer that serves the tool; retry once, only
/// with an idempotency key, and only after a transport failure or a `retryable_error`.
#[derive(Clone)]
pub struct OutboundBack {
    outbound: Arc<Outbound>,
}

impl OutboundBack {
    pub fn new(outbound: Arc<Outbound>) -> Self {
        OutboundBack { outbound }
    }
}

impl Service<ToolCall> for OutboundBack {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let outbound = self.outbound.clone();
        Box::pin(async move {
            let route = outbound
                .routes
                .load()
                .get(&call.tool.name)
                .cloned()
                .ok_or_else(|| Rejection::ToolNotFound(call.tool.name.clone()))?;
            let peer = match route {
                Route::Peer(peer) => peer,
                Route::Skill(id) => {
                    let skill = outbound
                        .skills
                        .get(&id)
                        .ok_or_else(|| Rejection::Internal(format!("no skill {id}")))?;
                    return crate::skill_v1::call_skill(
                        &skill.client,
                        &skill.config.skill_id,
                        &skill.config.protocol_version,
                        skill.signing.as_ref(),
                        &call,
                    )
                    .await;
                }
            };
            let client = outbound.client_for(&peer)?;
            let first = call_peer(&client, &call).await;
            let retry = call.idempotency_key.is_some()
                && matches!(
                    &first,
                    Err(Rejection::AppUnavailable(_))
                        | Ok(CallOutcome::AppError {
                            retryable: true,
                            ..
                        })
                );
            if retry {
                tracing::info!(call_id = %call.call_id, peer = %peer, "retrying once");
                return call_peer(&client, &call).await;
            }
            first
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carapace_filters::call::{Credential, Principal, ToolSpec};
    use carapace_filters::schema::CompiledSchema;
    use serde_json::{json, Value};

    fn call(call_id: &str, tool: &str) -> ToolCall {
        ToolCall {
            call_id: call_id.into(),
            tool: Arc::new(ToolSpec {
                name: tool.into(),
                description: String::new(),
                input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
                output: None,
                timeout_ms_default: 1_000,
                timeout_ms_max: 5_000,
                idempotent: false,
                side_effects: false,
            }),
            tenant_id: None,
            args: json!({}),
            context: None,
            timeout_ms: None,
            idempotency_key: None,
            principal: Arc::new(Principal::local()),
            request_id: None,
            trace_context: Vec::new(),
            credential: Credential::None,
        }
    }

    /// The reference tool host's answers (`toolhost_http.json`): every envelope is decoded
    /// for what it says, plain-text refusals are the host's transport errors.
    #[test]
    fn crabstack_tool_host_answers_are_passed_through() {
        let path = format!(
            "{}/../shared/vectors/crabstack/toolhost_http.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let cases: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let mut seen = 0;
        for case in cases["cases"].as_array().unwrap() {
            if case["path"] != "/v1/tools/call" {
                continue;
            }
            seen += 1;
            let id = case["id"].as_str().unwrap();
            let request: Value = serde_json::from_str(case["request_body"].as_str().unwrap_or(""))
                .unwrap_or(Value::Null);
            let s = |k: &str| request.get(k).and_then(Value::as_str).unwrap_or("x");
            let c = call(s("call_id"), s("tool_name").trim());
            let status = http::StatusCode::from_u16(case["status"].as_u64().unwrap() as u16);
            let body = case["response_body"].as_str().unwrap().as_bytes();
            let got = decode_peer_answer(status.unwrap(), body, &c);
            let envelope: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            match (case["status"].as_u64(), envelope["status"].as_str()) {
                (Some(200), Some("ok")) if id == "call.args_not_object" => {
                    // A result that is not an object breaks the tools-v1 response schema.
                    assert!(
                        matches!(got, Err(Rejection::AppInvalid(_))),
                        "{id}: {got:?}"
                    )
                }
                (Some(200), Some("ok")) if id == "call.version_passthrough" => {
                    assert!(
                        matches!(got, Err(Rejection::AppInvalid(_))),
                        "{id}: {got:?}"
                    )
                }
                (Some(200), Some("ok")) => {
                    assert!(matches!(got, Ok(CallOutcome::Ok { .. })), "{id}: {got:?}")
                }
                (Some(200), Some("error")) => match got {
                    Ok(CallOutcome::AppError {
                        code,
                        message,
                        retryable,
                        ..
                    }) => {
                        assert_eq!(code, envelope["error"]["code"], "{id}");
                        assert_eq!(message, envelope["error"]["message"], "{id}");
                        assert!(!retryable, "{id}");
                    }
                    other => panic!("{id}: {other:?}"),
                },
                (Some(200), Some("timeout")) => {
                    assert!(matches!(got, Err(Rejection::Timeout(_))), "{id}: {got:?}")
                }
                (Some(code), None) => {
                    assert!(
                        matches!(got, Err(Rejection::AppHttp(c)) if u64::from(c) == code),
                        "{id}: {got:?}"
                    )
                }
                other => panic!("{id}: unexpected case {other:?}"),
            }
        }
        assert_eq!(seen, 22);
    }

    /// carapace's style: an HTTP error status with the envelope.
    #[test]
    fn a_refusal_with_an_http_error_status_keeps_its_code_details_and_retryability() {
        let c = call("c1", "memory.query");
        let envelope = |status: &str, code: &str, call_id: &str| {
            json!({"version": "v1", "call_id": call_id, "tool_name": "", "status": status,
                   "error": {"code": code, "message": "peer gw_home is revoked",
                             "details": {"reason": "revoked"}, "retryable": false},
                   "duration_ms": 0})
            .to_string()
        };
        let got = decode_peer_answer(
            http::StatusCode::FORBIDDEN,
            envelope("error", "FORBIDDEN", "").as_bytes(),
            &c,
        );
        let Ok(CallOutcome::AppError {
            code,
            message,
            details,
            retryable,
        }) = got
        else {
            panic!("{got:?}")
        };
        assert_eq!(
            (code.as_str(), message.as_str(), retryable),
            ("FORBIDDEN", "peer gw_home is revoked", false)
        );
        assert_eq!(details, Some(json!({"reason": "revoked"})));
        // Retryable only as `status: retryable_error` says, whatever the HTTP status.
        for http_status in [http::StatusCode::OK, http::StatusCode::BAD_GATEWAY] {
            let got = decode_peer_answer(
                http_status,
                envelope("retryable_error", "DEPENDENCY_UNAVAILABLE", "c1").as_bytes(),
                &c,
            );
            assert!(
                matches!(
                    got,
                    Ok(CallOutcome::AppError {
                        retryable: true,
                        ..
                    })
                ),
                "{got:?}"
            );
        }
        // Another call's answer, a code that is no code, no envelope at all.
        let got = decode_peer_answer(
            http::StatusCode::FORBIDDEN,
            envelope("error", "FORBIDDEN", "c2").as_bytes(),
            &c,
        );
        assert!(matches!(got, Err(Rejection::AppInvalid(_))), "{got:?}");
        let got = decode_peer_answer(
            http::StatusCode::FORBIDDEN,
            envelope("error", "forbidden\n", "").as_bytes(),
            &c,
        );
        assert!(
            matches!(&got, Ok(CallOutcome::AppError { code, .. }) if code == "INTERNAL"),
            "{got:?}"
        );
        let got = decode_peer_answer(http::StatusCode::BAD_GATEWAY, b"bad gateway", &c);
        assert!(matches!(got, Err(Rejection::AppHttp(502))), "{got:?}");
    }
}
