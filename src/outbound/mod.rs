//! The outbound (gateway) role: the local agent sends plain tools-v1 calls to a Unix socket;
//! carapace routes each by its registry, never by a URL from the caller: tool name → paired
//! peer (discovered from the peers in `outbound.peers`), called over mTLS with the gateway's
//! client certificate and the peer's certificate pinned to its paired record; or capability →
//! skill id → URL (`outbound.skills`), called with a signed Skill Gateway v1 `/run`. Input is
//! validated before sending and output after receiving.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use carapace_filters::Rejection;
use discovery::{compiled_peer_tools, discover, merge};
use http::Method;
use known::KnownTools;
use routes::{skill_routes, Route, SkillRoute};

use crate::catalog::pins::{ApproveError, PinStore};
use crate::catalog::{Catalog, CatalogHandle};
use crate::config::Loaded;
use crate::pairing::identity::GatewayIdentity;
use crate::pairing::wire::fingerprints_match;
use crate::peers::PeerStore;
use crate::upstream::AppClient;

mod client_cert;
mod pinned;
pub use pinned::PinnedPeer;
mod back;
mod discovery;
mod eat;
pub mod health;
mod known;
pub mod mcp_stdio;
mod routes;
pub mod search;
pub(crate) mod stack;
pub use back::OutboundBack;
#[cfg(test)]
mod tests;

/// Building the outbound role failed.
#[derive(Debug, thiserror::Error)]
#[error("outbound: {0}")]
pub struct OutboundError(String);

/// The peers, their clients and the routes.
pub struct Outbound {
    peers: Arc<PeerStore>,
    addresses: BTreeMap<String, std::net::SocketAddr>,
    /// The gateway's client certificate and key, renewed at half their life.
    client_certs: client_cert::ClientCerts,
    pool: crate::config::PoolConfig,
    max_response_bytes: u64,
    /// Per peer: the fingerprint and the client certificate's generation a client was made
    /// for, and the client.
    clients: std::sync::Mutex<HashMap<String, (String, u64, AppClient)>>,
    /// Skill Gateway v1 skills, by skill id.
    skills: BTreeMap<String, SkillRoute>,
    /// Tool name → where it is served.
    routes: ArcSwap<HashMap<String, Route>>,
    pub catalog: Arc<CatalogHandle>,
    /// One discovery at a time, so the last to finish is the latest.
    refreshing: tokio::sync::Mutex<()>,
    /// Each peer's last discovery document, persisted in [`KNOWN_TOOLS_FILE`].
    known: KnownTools,
    /// The pins of the tools the peers and skills serve, in [`PINS_FILE`].
    pins: PinStore,
    /// The gateway's identity key, signing the requests of the peers in `signed_peers`.
    signer: Arc<GatewaySigner>,
    /// Peers whose requests are signed (RFC 9421, `outbound.peers.<id>.http_signature`).
    signed_peers: std::collections::BTreeSet<String>,
    /// EAT catalogs, by id (`outbound.eat`).
    eat: BTreeMap<String, eat::EatSource>,
    /// Wall clock (Unix milliseconds) for the catalogs' signatures.
    clock: carapace_filters::signature::UnixClock,
    /// What to do with each peer's receipts (`outbound.peers.<id>.receipts`).
    receipt_modes: BTreeMap<String, crate::receipts::ReceiptMode>,
    metrics: Arc<crate::ops::metrics::Metrics>,
    /// The circuit of every peer and skill.
    pub health: Arc<health::ProviderHealth>,
    /// Full-text search over the tools, rebuilt at every discovery.
    index: search::ToolIndex,
}

/// The gateway's Ed25519 identity key as an RFC 9421 signer, `keyid` the gateway id (the
/// `component_id` a tool host knows the gateway by).
pub struct GatewaySigner {
    id: String,
    key: crate::pairing::wire::SigningIdentity,
}

impl carapace_filters::http_signature::MessageSigner for GatewaySigner {
    fn keyid(&self) -> &str {
        &self.id
    }
    fn alg(&self) -> &'static str {
        "ed25519"
    }
    fn sign(&self, base: &[u8]) -> Vec<u8> {
        self.key.sign_bytes(base)
    }
}

/// The file in `state_dir` keeping the pins of the outbound role's tools.
pub const PINS_FILE: &str = "outbound-tool-pins.json";

/// The file in `state_dir` keeping each peer's last discovery document.
pub const KNOWN_TOOLS_FILE: &str = "outbound_tools.json";

/// How long a pairing's confirmation may take: discovery with the issued certificate is
/// retried this long.
pub const CONFIRM_WINDOW: std::time::Duration = std::time::Duration::from_secs(2);
const CONFIRM_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

impl Outbound {
    /// Clients present a client certificate the gateway's CA issues now.
    pub fn new(
        cfg: &Loaded,
        gateway: &Arc<GatewayIdentity>,
        peers: Arc<PeerStore>,
        clock: carapace_filters::signature::UnixClock,
    ) -> Result<Self, OutboundError> {
        let client_certs = client_cert::ClientCerts::issue(gateway.clone(), clock.clone())
            .map_err(OutboundError)?;
        let skills = skill_routes(cfg)?;
        let outbound = Outbound {
            receipt_modes: cfg
                .config
                .outbound
                .iter()
                .flat_map(|o| &o.peers)
                .map(|(id, p)| (id.clone(), p.receipts))
                .collect(),
            metrics: Arc::default(),
            index: search::ToolIndex::new()
                .map_err(|e| OutboundError(format!("tool index: {e}")))?,
            health: Arc::new(health::ProviderHealth::new(
                &cfg.config
                    .outbound
                    .as_ref()
                    .map(|o| o.health.clone())
                    .unwrap_or_default(),
            )),
            eat: eat::eat_sources(cfg)?,
            clock,
            skills,
            peers,
            addresses: cfg.outbound_peers.clone(),
            client_certs,
            pool: cfg.config.app.pool.clone(),
            max_response_bytes: cfg.config.limits.max_response_bytes,
            clients: std::sync::Mutex::new(HashMap::new()),
            routes: ArcSwap::from_pointee(HashMap::new()),
            catalog: Arc::new(CatalogHandle::default()),
            refreshing: tokio::sync::Mutex::new(()),
            known: KnownTools::load(cfg.config.state_dir.join(KNOWN_TOOLS_FILE)),
            pins: PinStore::open_at(cfg.config.state_dir.join(PINS_FILE)).map_err(OutboundError)?,
            signer: Arc::new(GatewaySigner {
                id: gateway.gateway_id.clone(),
                key: gateway.signing_key(),
            }),
            signed_peers: cfg
                .config
                .outbound
                .iter()
                .flat_map(|o| &o.peers)
                .filter(|(_, p)| p.http_signature)
                .map(|(id, _)| id.clone())
                .collect(),
        };
        outbound.restore_known(cfg);
        Ok(outbound)
    }

    /// Count into `metrics` (the process's registry) instead of a registry of its own.
    pub fn with_metrics(mut self, metrics: Arc<crate::ops::metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
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
        let generation = self.client_certs.generation();
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((fp, made_with, client)) = clients.get(peer) {
            if fingerprints_match(fp, fingerprint) && *made_with == generation {
                return Ok(client.clone());
            }
        }
        let internal = |e: String| Rejection::Internal(format!("client for {peer}: {e}"));
        let own = self.client_certs.current();
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(own.key_pem.as_bytes())
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
            .with_client_auth_cert(vec![own.cert], key)
            .map_err(|e| internal(e.to_string()))?;
        let mut client = AppClient::mtls(
            address,
            Arc::new(config),
            &self.pool,
            self.max_response_bytes,
        );
        if self.signed_peers.contains(peer) {
            client = client.with_signer(self.signer.clone());
        }
        let made = (fingerprint.to_string(), own.generation, client.clone());
        clients.insert(peer.to_string(), made);
        Ok(client)
    }

    /// Ask every paired peer for its tools and swap in the merged registry; a peer that is
    /// not paired (revoked, pending) or cannot be reached keeps the tools it last served (see
    /// [`KnownTools`]), so calls to them are refused the same way whenever they come. A name
    /// several sources offer is served once per source, qualified (see [`merge`]). One refresh
    /// runs at a time.
    ///
    /// [`merge`]: discovery::merge
    pub async fn refresh(&self, cfg: &Loaded) -> usize {
        let _one_at_a_time = self.refreshing.lock().await;
        let mut merged = Catalog::default();
        let mut routes = HashMap::new();
        let mut sources = Vec::new();
        for id in self.addresses.keys() {
            if let Some(doc) = self.peer_tools(id).await {
                sources.push((Route::Peer(id.clone()), compiled_peer_tools(id, &doc, cfg)));
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
                Ok(c) => sources.push((Route::Skill(id.clone()), c.tools)),
                Err(e) => {
                    let reason = e.to_string();
                    let reason = reason.split(':').next().unwrap_or_default().to_string();
                    tracing::warn!("skill_skipped skill_id={id} reason={reason}");
                    tracing::warn!("{e}");
                }
            }
        }
        let now = (self.clock)() / 1000;
        for (id, source) in &self.eat {
            sources.push((Route::Eat(id.clone()), source.tools(now).await));
        }
        merge(sources, &mut merged, &mut routes);
        self.pin(&mut merged, cfg);
        self.reindex(&merged, &routes);
        let n = merged.tools.len();
        merged.service = "carapace-outbound".into();
        self.routes.store(Arc::new(routes));
        self.catalog.replace(merged);
        n
    }
}

impl Outbound {
    /// Withhold the tools whose definitions are not the approved ones ([`PinStore`]).
    fn pin(&self, merged: &mut Catalog, cfg: &Loaded) {
        let mode = cfg
            .config
            .outbound
            .as_ref()
            .map(|o| o.pinning.outbound_mode())
            .unwrap_or(crate::config::PinMode::Warn);
        let tools = std::mem::take(&mut merged.tools);
        (merged.tools, merged.withheld) = self.pins.check(tools, mode, &cfg.outbound_pins);
    }

    /// Index the tools served now for [`Outbound::search`].
    fn reindex(&self, merged: &Catalog, routes: &HashMap<String, Route>) {
        let eat_tags: HashMap<&str, HashMap<String, Vec<String>>> = self
            .eat
            .iter()
            .map(|(id, source)| (id.as_str(), source.capabilities()))
            .collect();
        let tools: Vec<search::Indexed> = merged
            .tools
            .values()
            .filter_map(|t| {
                let (provider, kind, tags) = match routes.get(&t.name)? {
                    Route::Peer(id) => (id, "peer", vec![id.clone()]),
                    Route::Skill(id) => (id, "skill", vec![id.clone()]),
                    Route::Eat(id) => {
                        let mut tags = eat_tags
                            .get(id.as_str())
                            .and_then(|m| m.get(t.app_name()))
                            .cloned()
                            .unwrap_or_default();
                        tags.push(id.clone());
                        (id, "eat", tags)
                    }
                };
                Some(search::Indexed {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    tags,
                    provider: provider.clone(),
                    kind,
                })
            })
            .collect();
        if let Err(e) = self.index.replace(&tools) {
            tracing::error!("tool index not rebuilt: {e}");
        }
    }

    /// Search the tools `principal` may call: the best `limit` matches of `text`, each marked
    /// with whether its provider's circuit is closed.
    pub fn search(
        &self,
        text: &str,
        limit: usize,
        principal: &carapace_filters::call::Principal,
        now_ms: u64,
    ) -> Result<Vec<serde_json::Value>, String> {
        let permissions = principal.permissions.as_ref();
        let hits = self
            .index
            .search(text, limit, |name| {
                permissions.is_some_and(|p| p.may_call(name, now_ms))
            })
            .map_err(|e| e.to_string())?;
        Ok(hits
            .into_iter()
            .map(|h| {
                let state = self.health.of(&h.provider).state;
                let mut v = serde_json::to_value(&h).expect("a hit serializes");
                v["healthy"] = (state == health::CircuitState::Closed).into();
                v["circuit"] = serde_json::to_value(state).expect("a state serializes");
                v
            })
            .collect())
    }

    /// Every peer and skill this role calls, with its circuit (`carapace peers list`).
    pub fn provider_health(&self) -> Vec<serde_json::Value> {
        let peers = self.addresses.keys().map(|id| (id, "peer"));
        let skills = self.skills.keys().map(|id| (id, "skill"));
        peers
            .chain(skills)
            .map(|(id, kind)| {
                let h = self.health.of(id);
                serde_json::json!({
                    "id": id,
                    "kind": kind,
                    "state": h.state,
                    "consecutive_failures": h.consecutive_failures,
                    "last_seen_at": h.last_seen_ms.map(crate::receipts::rfc3339_ms),
                })
            })
            .collect()
    }

    /// Who serves `tool`, as the ledger names it: the peer's, skill's or EAT catalog's id.
    pub fn provider_of(&self, tool: &str) -> String {
        match self.routes.load().get(tool) {
            Some(Route::Peer(id) | Route::Skill(id) | Route::Eat(id)) => id.clone(),
            None => String::new(),
        }
    }

    /// Why the last discovery of the EAT catalog `id` failed, if it did.
    pub fn eat_refusal(&self, id: &str) -> Option<crate::eat::discover::DiscoveryError> {
        self.eat.get(id).and_then(eat::EatSource::refusal)
    }

    /// Approve the withheld tool `name`: it is served from the next discovery on.
    pub fn approve(&self, name: &str, cfg: &Loaded) -> Result<String, ApproveError> {
        let catalog = self.catalog.load();
        self.pins
            .approve(name, catalog.withheld.get(name), &cfg.outbound_pins)
    }
}
