//! The running sidecar: shared state, the filter stack in the order the design gives,
//! listeners, discovery, reload and drain.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::caller_body::CallerBody;
use arc_swap::ArcSwap;
use http::Request;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tower::util::BoxCloneSyncService;
use tower::ServiceBuilder;

use carapace_filters::authorization::AuthorizationLayer;
use carapace_filters::body::{BodyLimitLayer, BodyLimits};
use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::concurrency::LoadShedLayer;
use carapace_filters::identity::IdentityLayer;
use carapace_filters::kill_switch::{KillSwitch, KillSwitchLayer, Switches};
use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
use carapace_filters::rate_limit::{KeyedLimits, PeerRateLimitLayer, Rate, ToolRateLimitLayer};
use carapace_filters::schema::{InputSchemaLayer, OutputSchemaLayer};
use carapace_filters::signature::{
    AuthMode, ReplayGuard, SignatureLayer, SignatureVerifier, SigningKey, UnixClock,
};
use carapace_filters::timeout::CallTimeoutLayer;
use carapace_filters::Rejection;

use crate::catalog::CatalogHandle;
use crate::config::{AuthModeConfig, Loaded, Protocol, RateConfig, SharedStateBackend};
use crate::edge::{edge, PanicAnswer};
use crate::errors::ToolsV1Answers;
use crate::front::{CallStack, Envelope, Resp};
use crate::ops::metrics::Metrics;
use crate::outbound::{Outbound, OutboundBack};
use crate::pairing::handshake::{Installed, RemoteConfig};
use crate::pairing::identity::{GatewayIdentity, HostIdentity};
use crate::peers::PeerStore;
use crate::shared_state::RedisState;
use crate::skill_v1::{AppSigning, SkillV1Back, SkillV1Front};
use crate::tools_v1::{ToolsV1Back, ToolsV1Front};
use crate::upstream::AppClient;

/// The service every listener hands requests to.
pub use crate::edge::HttpStack;

/// Starting failed; nothing is left listening.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    KillSwitch(#[from] carapace_filters::kill_switch::KillSwitchError),
    #[error("nonce store: {0}")]
    Nonces(#[from] carapace_filters::nonce::NonceError),
    #[error(transparent)]
    Peers(#[from] crate::peers::PeerStoreError),
    #[error(transparent)]
    Redis(#[from] crate::shared_state::RedisSetupError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Identity(#[from] crate::pairing::identity::IdentityError),
    #[error(transparent)]
    Outbound(#[from] crate::outbound::OutboundError),
    #[error("MCP session key: {0}")]
    McpSessionKey(std::io::Error),
    #[error("cannot bind {what} {address}: {source}")]
    Bind {
        what: &'static str,
        address: String,
        source: std::io::Error,
    },
}

/// State shared by listeners, the admin socket, the ops endpoint and reloads.
pub struct Shared {
    pub config: ArcSwap<Loaded>,
    pub kill_switch: KillSwitch,
    pub nonces: Option<Arc<NonceStore>>,
    /// The store shared by the replicas, with `shared_state.backend: redis`.
    pub redis: Option<RedisState>,
    pub peers: Arc<PeerStore>,
    pub catalog: Arc<CatalogHandle>,
    pub metrics: Arc<Metrics>,
    pub app: ArcSwap<AppClient>,
    pub(crate) stack: Arc<ArcSwap<HttpStack>>,
    /// The outbound role's stack (serves only when `outbound` is configured).
    outbound_stack: Arc<ArcSwap<HttpStack>>,
    pub(crate) tls: arc_swap::ArcSwapOption<crate::tls::ListenerTls>,
    listening: AtomicBool,
    rediscover: tokio::sync::Notify,
    outbound_rediscover: tokio::sync::Notify,
    /// Wall clock for signature windows and nonce expiry (injected in tests).
    pub clock: UnixClock,
    /// Serializes reloads (SIGHUP and the admin socket).
    reload_lock: tokio::sync::Mutex<()>,
    /// The concurrency limit, kept across reloads so calls in flight keep counting.
    load_shed: std::sync::Mutex<Option<(usize, LoadShedLayer)>>,
    /// Gateway role: its identity and pairing CA.
    pub gateway: Option<Arc<crate::pairing::identity::GatewayIdentity>>,
    /// The outbound role, when configured (pairings confirm through it).
    pub outbound: std::sync::OnceLock<Arc<Outbound>>,
    /// The MCP front's sessions (older protocol era), when the front is MCP.
    pub mcp_sessions: Option<Arc<crate::mcp::session::Sessions>>,
    /// Calls in flight that their callers may cancel (kept across reloads).
    pub in_flight: Arc<crate::in_flight::InFlightCalls>,
}

impl Shared {
    /// The concurrency limit: the same permits as before unless the limit changed.
    fn load_shed_layer(&self, max: usize) -> LoadShedLayer {
        let mut current = self.load_shed.lock().unwrap_or_else(|e| e.into_inner());
        match &*current {
            Some((m, layer)) if *m == max => layer.clone(),
            _ => {
                let layer = LoadShedLayer::new(max);
                *current = Some((max, layer.clone()));
                layer
            }
        }
    }

    /// Run discovery again now (after a reload, or when the global kill-switch is released).
    pub fn request_discovery(&self) {
        self.rediscover.notify_one();
        self.outbound_rediscover.notify_one();
    }

    /// Ready: listeners bound and discovery succeeded.
    pub fn ready(&self) -> bool {
        self.listening.load(Ordering::Acquire) && self.catalog.discovered()
    }
}

fn rate(r: RateConfig) -> Rate {
    let (n, window) = r.quota().expect("validated");
    Rate::per(
        NonZeroU32::new(n).expect("validated"),
        window,
        NonZeroU32::new(r.burst).expect("validated"),
    )
}

/// Limits in this process, or in the shared store when there is one.
fn keyed_limits(
    shared: &Shared,
    scope: &'static str,
    default: Option<RateConfig>,
    overrides: &BTreeMap<String, RateConfig>,
) -> KeyedLimits {
    let default = default.map(rate);
    let overrides = overrides.iter().map(|(k, r)| (k.clone(), rate(*r)));
    match &shared.redis {
        Some(redis) => KeyedLimits::shared(scope, default, overrides, Arc::new(redis.clone())),
        None => KeyedLimits::new(default, overrides),
    }
}

fn auth_mode(m: AuthModeConfig) -> AuthMode {
    match m {
        AuthModeConfig::Hmac => AuthMode::Hmac,
        AuthModeConfig::ApiKey => AuthMode::ApiKey,
    }
}

/// The call-stage stack: per-tool kill-switch, per-tool rate limit, signature, input schema,
/// timeout, output schema, back.
fn call_stack(cfg: &Loaded, shared: &Shared, app: AppClient) -> CallStack {
    let c = &cfg.config;
    let back: BoxCloneSyncService<ToolCall, CallOutcome, Rejection> = match c.app.protocol {
        Protocol::ToolsV1 => BoxCloneSyncService::new(ToolsV1Back::new(app)),
        Protocol::Mcp => unreachable!("refused by the configuration check"),
        Protocol::SkillV1 => {
            let skill = c.app.skill.as_ref().expect("validated");
            let signing = skill.auth.as_ref().map(|a| AppSigning {
                mode: auth_mode(a.mode),
                header: a
                    .header_name
                    .as_deref()
                    .map(|h| http::HeaderName::from_bytes(h.as_bytes()).expect("validated")),
                secret: cfg.app_secret.clone().expect("validated"),
            });
            BoxCloneSyncService::new(SkillV1Back::new(
                app,
                &skill.skill_id,
                &skill.protocol_version,
                signing,
            ))
        }
    };
    let tool_limits = Arc::new(keyed_limits(
        shared,
        "tool",
        c.rate_limits.per_tool,
        &c.rate_limits.tools,
    ));
    let signature = c.front.auth.as_ref().map(|auth| {
        let keys = cfg
            .caller_keys
            .iter()
            .map(|(id, s)| SigningKey {
                id: id.clone(),
                secret: s.bytes().clone(),
            })
            .collect();
        SignatureLayer::new(Arc::new(SignatureVerifier::new(
            auth_mode(auth.mode),
            keys,
            Duration::from_secs(auth.timestamp_skew_s),
            match &shared.redis {
                Some(redis) => ReplayGuard::Shared {
                    store: Arc::new(redis.clone()),
                    ttl: Duration::from_secs(auth.nonce_ttl_s),
                },
                None => ReplayGuard::Local(
                    shared
                        .nonces
                        .clone()
                        .expect("a signed front has a nonce store"),
                ),
            },
            shared.clock.clone(),
        )))
    });
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
            .layer(ToolRateLimitLayer::new(tool_limits))
            .layer(AuthorizationLayer::new(shared.clock.clone()).on_allowed(seen(shared)))
            .option_layer(signature)
            .layer(InputSchemaLayer)
            .layer(CallTimeoutLayer)
            .layer(OutputSchemaLayer)
            .service(back),
    )
}

/// Notes each accepted call's peer in the peer store (`last_seen_at`).
fn seen(shared: &Shared) -> carapace_filters::authorization::AllowedHook {
    let peers = shared.peers.clone();
    Arc::new(move |principal, now_ms| peers.note_seen(principal, now_ms))
}

/// The whole stack: identity, global kill-switch, per-peer rate limit, load shedding, body
/// limits, the front (decode, call stage, encode), wrapped in the front's error envelope.
pub fn build_stack(cfg: &Loaded, shared: &Arc<Shared>) -> HttpStack {
    let c = &cfg.config;
    let control = Arc::downgrade(shared);

    let calls = call_stack(cfg, shared, shared.app.load().as_ref().clone());
    let peer_limits = Arc::new(keyed_limits(
        shared,
        "peer",
        c.rate_limits.per_peer,
        &BTreeMap::new(),
    ));
    let body = BodyLimits {
        max_bytes: c.limits.max_body_bytes,
        deadline: Duration::from_millis(c.limits.body_timeout_ms),
    };
    let http = ServiceBuilder::new()
        .layer(identity_layer(cfg, shared))
        .layer(crate::ops::control::ControlPlaneLayer::new(control))
        .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
        .option_layer((c.front.protocol == Protocol::Mcp).then(|| {
            crate::mcp::early::MirroredHeaderLayer::new(
                shared.kill_switch.clone(),
                shared.clock.clone(),
            )
        }))
        .layer(PeerRateLimitLayer::new(peer_limits))
        .layer(shared.load_shed_layer(c.limits.max_in_flight))
        .layer(BodyLimitLayer::new(body));
    let answers = c.front.answers.unwrap_or_default();
    let panic = PanicAnswer {
        front: c.front.protocol,
        answers,
    };
    match c.front.protocol {
        Protocol::ToolsV1 => edge(
            Envelope::new(
                http.service(ToolsV1Front::new(
                    shared.catalog.clone(),
                    calls,
                    shared.clock.clone(),
                    answers,
                    shared.in_flight.clone(),
                )),
                Protocol::ToolsV1,
                answers,
                shared.metrics.clone(),
            ),
            panic,
        ),
        Protocol::SkillV1 => {
            let auth = c.front.auth.as_ref().expect("validated");
            edge(
                Envelope::new(
                    http.service(SkillV1Front::new(
                        cfg.front_skill_id.as_deref().expect("validated"),
                        auth_mode(auth.mode),
                        auth.header_name.as_deref(),
                        shared.catalog.clone(),
                        calls,
                        shared.clock.clone(),
                    )),
                    Protocol::SkillV1,
                    ToolsV1Answers::default(),
                    shared.metrics.clone(),
                ),
                panic,
            )
        }
        Protocol::Mcp => edge(
            Envelope::new(
                http.service(crate::mcp::McpFront::new(
                    shared.catalog.clone(),
                    calls,
                    shared.clock.clone(),
                    Arc::new(c.front.mcp.clone().unwrap_or_default()),
                    shared
                        .mcp_sessions
                        .clone()
                        .expect("made at start for an mcp front"),
                    shared.in_flight.clone(),
                )),
                Protocol::Mcp,
                answers,
                shared.metrics.clone(),
            ),
            panic,
        ),
    }
}

/// Identity, with the front's configured credential header counted as one.
fn identity_layer(cfg: &Loaded, shared: &Shared) -> IdentityLayer {
    let c = &cfg.config;
    let layer = IdentityLayer::new(shared.peers.clone(), c.front.protocol == Protocol::SkillV1);
    match c
        .front
        .auth
        .as_ref()
        .and_then(|a| a.header_name.as_deref())
        .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok())
    {
        Some(h) => layer.credential_header(h),
        None => layer,
    }
}

/// The outbound role's stack: the local agent's calls, validated, routed to paired peers.
fn build_outbound_stack(cfg: &Loaded, shared: &Shared, outbound: Arc<Outbound>) -> HttpStack {
    let c = &cfg.config;
    let answers = c.outbound.as_ref().map(|o| o.answers).unwrap_or_default();
    let calls: CallStack = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
            .layer(AuthorizationLayer::new(shared.clock.clone()))
            .layer(InputSchemaLayer)
            .layer(CallTimeoutLayer)
            .layer(OutputSchemaLayer)
            .service(OutboundBack::new(outbound.clone())),
    );
    let body = BodyLimits {
        max_bytes: c.limits.max_body_bytes,
        deadline: Duration::from_millis(c.limits.body_timeout_ms),
    };
    let http = ServiceBuilder::new()
        .layer(IdentityLayer::new(shared.peers.clone(), false))
        .layer(KillSwitchLayer::new(shared.kill_switch.clone()))
        .layer(shared.load_shed_layer(c.limits.max_in_flight))
        .layer(BodyLimitLayer::new(body));
    let panic = PanicAnswer {
        front: Protocol::ToolsV1,
        answers,
    };
    edge(
        Envelope::new(
            http.service(ToolsV1Front::new(
                outbound.catalog.clone(),
                calls,
                shared.clock.clone(),
                answers,
                shared.in_flight.clone(),
            )),
            Protocol::ToolsV1,
            answers,
            shared.metrics.clone(),
        ),
        panic,
    )
}

/// Stands in until the real stack is built, before anything listens.
fn placeholder_stack() -> HttpStack {
    let never = tower::service_fn(|_: Request<CallerBody>| async {
        unreachable!("replaced before listening")
    });
    let panic = PanicAnswer {
        front: Protocol::ToolsV1,
        answers: ToolsV1Answers::default(),
    };
    edge::<_>(tower::util::MapResponse::new(never, |r: Resp| r), panic)
}

fn app_client(cfg: &Loaded) -> AppClient {
    AppClient::new(
        cfg.app_address.clone(),
        &cfg.config.app.pool,
        cfg.config.limits.max_response_bytes,
    )
}

fn tls_acceptor(cfg: &Loaded) -> Result<Option<crate::tls::ListenerTls>, StartError> {
    let tls = cfg
        .config
        .listeners
        .tcp
        .as_ref()
        .and_then(|t| t.tls.as_ref());
    match tls {
        Some(tls) => {
            let paired = crate::tls::PairedFiles::current(&cfg.config.state_dir);
            Ok(Some(crate::tls::listener_tls(tls, paired.as_ref())?))
        }
        None => Ok(None),
    }
}

fn switches(cfg: &Loaded) -> Switches {
    Switches {
        global: cfg.config.kill_switch.global,
        tools: cfg.config.kill_switch.tools.iter().cloned().collect(),
    }
}

fn create_private_dir(path: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::DirBuilderExt;
    let fail = |source| StartError::StateDir {
        path: path.into(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(fail)?;
    make_private(path).map_err(fail)
}

/// The state directory holds keys and the replay journal: only its owner may enter it. A
/// directory of ours that others may enter (a volume mounted `0777`) is made `0700`, saying
/// so; one that belongs to another user is refused.
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(path)?;
    if !meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let me = crate::ops::admin::effective_uid()?;
    if meta.uid() != me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "mode {mode:o} lets others in and it belongs to uid {}, not to this process",
                meta.uid()
            ),
        ));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7700))?;
    tracing::warn!(
        "state_dir {} had mode {mode:o}; made it {:o} (only its owner may enter)",
        path.display(),
        mode & 0o7700
    );
    Ok(())
}

/// A started sidecar.
pub struct Running {
    pub shared: Arc<Shared>,
    /// The bound TCP listener address (useful with port 0).
    pub tcp_address: Option<SocketAddr>,
    /// The bound ops address.
    pub ops_address: Option<SocketAddr>,
    /// The bound pairing endpoint address.
    pub pairing_address: Option<SocketAddr>,
    pub unix_path: Option<PathBuf>,
    pub admin_socket: PathBuf,
    shutdown: watch::Sender<bool>,
    tasks: tokio::task::JoinSet<()>,
    graceful: Arc<tokio::sync::Mutex<Option<GracefulShutdown>>>,
}

impl Running {
    /// Stop accepting, let calls in flight finish (up to the drain timeout), then return.
    pub async fn shutdown(mut self) {
        let drain = Duration::from_secs(self.shared.config.load().config.limits.drain_timeout_s);
        let _ = self.shutdown.send(true);
        // Accept loops end first, so no new connection is watched after this point.
        while let Some(r) = self.tasks.join_next().await {
            if let Err(e) = r {
                if e.is_panic() {
                    tracing::error!("task panicked: {e}");
                }
            }
        }
        let graceful = self.graceful.lock().await.take();
        if let Some(g) = graceful {
            if tokio::time::timeout(drain, g.shutdown()).await.is_err() {
                tracing::warn!("drain timeout elapsed; closing remaining connections");
            }
        }
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_file(&self.admin_socket);
        tracing::info!("stopped");
    }

    /// Re-read the configuration file and apply it atomically; a bad file is refused.
    pub async fn reload(&self) -> Result<(), Vec<String>> {
        reload(&self.shared).await
    }
}

/// Settings that only take effect at start; a reload that changes one is refused.
fn restart_only_changes(old: &Loaded, new: &Loaded) -> Vec<String> {
    let (o, n) = (&old.config, &new.config);
    let nonce = |c: &crate::config::Config| {
        format!(
            "{:?}",
            c.front
                .auth
                .as_ref()
                .map(|a| (a.nonce_ttl_s, a.nonce_capacity))
        )
    };
    let pairs = [
        (
            "listeners.unix, listeners.tcp.address",
            format!("{:?}{:?}", o.listeners.unix, old.tcp_address),
            format!("{:?}{:?}", n.listeners.unix, new.tcp_address),
        ),
        (
            "state_dir",
            format!("{:?}", o.state_dir),
            format!("{:?}", n.state_dir),
        ),
        (
            "front.protocol, front.skill_id",
            format!("{:?}{:?}", o.front.protocol, old.front_skill_id),
            format!("{:?}{:?}", n.front.protocol, new.front_skill_id),
        ),
        ("front.auth nonce settings", nonce(o), nonce(n)),
        (
            "shared_state",
            format!("{:?}", o.shared_state),
            format!("{:?}", n.shared_state),
        ),
        (
            "ops.address",
            format!("{:?}", old.ops_address),
            format!("{:?}", new.ops_address),
        ),
        (
            "admin.socket",
            format!("{:?}", old.admin_socket()),
            format!("{:?}", new.admin_socket()),
        ),
        (
            "peers.file",
            format!("{:?}", old.peers_file()),
            format!("{:?}", new.peers_file()),
        ),
        (
            "limits.max_connections",
            o.limits.max_connections.to_string(),
            n.limits.max_connections.to_string(),
        ),
        (
            "telemetry",
            format!("{:?}", o.telemetry),
            format!("{:?}", n.telemetry),
        ),
        (
            "limits.max_connections_per_peer",
            o.limits.max_connections_per_peer.to_string(),
            n.limits.max_connections_per_peer.to_string(),
        ),
        ("log", format!("{:?}", o.log), format!("{:?}", n.log)),
        (
            "runtime",
            format!("{:?}", o.runtime),
            format!("{:?}", n.runtime),
        ),
        (
            "pairing",
            format!("{:?}", o.pairing),
            format!("{:?}", n.pairing),
        ),
        (
            "gateway",
            format!("{:?}", o.gateway),
            format!("{:?}", n.gateway),
        ),
        (
            "outbound",
            format!("{:?}", o.outbound),
            format!("{:?}", n.outbound),
        ),
    ];
    pairs
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(what, _, _)| format!("{what} cannot change on reload; restart to apply it"))
        .collect()
}

/// Apply a reloaded configuration: everything is built first and swapped in only if all of it
/// succeeded, so a bad configuration leaves the old one serving. Reloads are serialized.
pub async fn reload(shared: &Arc<Shared>) -> Result<(), Vec<String>> {
    let _guard = shared.reload_lock.lock().await;
    let old = shared.config.load_full();
    let prepared = crate::config::load(&old.source)
        .map_err(|e| e.0.iter().map(|e| e.to_string()).collect::<Vec<_>>())
        .and_then(|new| {
            let changed = restart_only_changes(&old, &new);
            if !changed.is_empty() {
                return Err(changed);
            }
            let tls = tls_acceptor(&new).map_err(|e| vec![e.to_string()])?;
            Ok((new, tls))
        });
    let (new, tls) = match prepared {
        Ok(p) => p,
        Err(errors) => {
            for e in &errors {
                tracing::error!("reload refused: {e}");
            }
            shared.metrics.reload(false);
            return Err(errors);
        }
    };
    let new = Arc::new(new);
    // Tool settings from the configuration (timeouts, the skill) shape the compiled catalog.
    let tools_changed = format!("{:?}{:?}", new.config.tools, new.config.app.skill)
        != format!("{:?}{:?}", old.config.tools, old.config.app.skill);
    if new.app_address != old.app_address
        || format!("{:?}", new.config.app.pool) != format!("{:?}", old.config.app.pool)
    {
        shared.app.store(Arc::new(app_client(&new)));
    }
    let stack = build_stack(&new, shared);
    shared.kill_switch.set_config(switches(&new));
    shared.tls.store(tls.map(Arc::new));
    shared.config.store(new);
    shared.stack.store(Arc::new(stack));
    if let Err(e) = shared.peers.reload_if_changed() {
        tracing::error!("peer store kept as it was: {e}");
    }
    shared.metrics.peers.set(shared.peers.len() as i64);
    if tools_changed {
        shared.catalog.invalidate();
    }
    shared.request_discovery();
    shared.metrics.reload(true);
    tracing::info!("config_reloaded path={}", old.source.display());
    Ok(())
}

/// Remove a stale socket file at `path`, refusing if something is listening there.
fn claim_socket_path(path: &Path, what: &'static str) -> Result<(), StartError> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(StartError::Bind {
            what,
            address: path.display().to_string(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        });
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StartError::Bind {
            what,
            address: path.display().to_string(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Start everything: state, stores, listeners, discovery. Nothing is bound if the state
/// cannot be loaded.
pub async fn start(cfg: Loaded) -> Result<Running, StartError> {
    start_with_clock(cfg, Arc::new(carapace_filters::unix_now_ms)).await
}

/// [`start`] with an injected wall clock (Unix milliseconds).
pub async fn start_with_clock(cfg: Loaded, clock: UnixClock) -> Result<Running, StartError> {
    let c = &cfg.config;
    create_private_dir(&c.state_dir)?;
    let kill_switch = KillSwitch::open(switches(&cfg), c.state_dir.join("killswitch.json"))?;
    let redis = match (&c.shared_state.backend, &c.shared_state.redis) {
        (SharedStateBackend::Redis, Some(r)) => {
            Some(RedisState::new(r, cfg.redis_password.as_ref())?)
        }
        _ => None,
    };
    if let Some(redis) = &redis {
        // Not fatal: calls that need the store are refused until it answers.
        match redis.verify().await {
            Ok(()) => tracing::info!("shared_state backend=redis usable=true"),
            Err(e) => tracing::warn!(
                "shared_state backend=redis usable=false: {e}; signed and rate-limited calls \
                 are refused with DEPENDENCY_UNAVAILABLE until it is"
            ),
        }
    }
    let nonces = match &c.front.auth {
        Some(_) if redis.is_some() => None,
        Some(auth) => Some(Arc::new(NonceStore::open(
            NonceStoreConfig {
                capacity: auth.nonce_capacity,
                ttl: Duration::from_secs(auth.nonce_ttl_s),
                journal: Some(c.state_dir.join("nonces.journal")),
            },
            clock(),
        )?)),
        None => None,
    };
    let peers = Arc::new(PeerStore::open(cfg.peers_file())?.with_clock(clock.clone()));
    // No pairing runs yet: what unfinished ones left behind goes.
    let stale = peers.remove_all_pending()?;
    let unfinished = crate::tls::PairedFiles::remove_unfinished(&c.state_dir);
    if stale + unfinished > 0 {
        tracing::warn!("removed unfinished pairings: records={stale} directories={unfinished}");
    }
    let tls = tls_acceptor(&cfg)?;
    let gateway = match &c.gateway {
        Some(g) => Some(Arc::new(GatewayIdentity::load_or_create(
            &c.state_dir,
            &g.id,
        )?)),
        None => None,
    };
    let host = match &c.pairing {
        Some(_) => Some(Arc::new(HostIdentity::load_or_create(&c.state_dir)?)),
        None => None,
    };
    let metrics = Arc::new(Metrics::default());
    metrics.peers.set(peers.len() as i64);
    let mcp_sessions = match c.front.protocol {
        Protocol::Mcp => {
            let key = match &cfg.mcp_session_key {
                Some(k) => k.bytes().to_vec(),
                None => crate::mcp::session::load_or_create_key(&c.state_dir)
                    .map_err(StartError::McpSessionKey)?,
            };
            let mcp = c.front.mcp.clone().unwrap_or_default();
            Some(Arc::new(crate::mcp::session::Sessions::new(&key, &mcp)))
        }
        _ => None,
    };

    tracing::info!("remote_gateway enabled=true");
    tracing::info!(
        "remote_gateway kill_switch={}",
        kill_switch.global_engaged()
    );
    if kill_switch.global_engaged() {
        tracing::warn!("GATEWAY_DISABLED");
        tracing::warn!("registration_skipped reason=kill_switch_active");
    }
    tracing::info!("registry_loaded path={}", cfg.source.display());
    if let Some(skill) = &c.app.skill {
        tracing::info!(
            "registry_summary skills=1 capabilities={}",
            skill.capabilities.len()
        );
    }

    let shared = Arc::new_cyclic(|_| Shared {
        app: ArcSwap::from_pointee(app_client(&cfg)),
        config: ArcSwap::from_pointee(cfg.clone()),
        kill_switch,
        nonces,
        redis,
        peers,
        catalog: Arc::new(CatalogHandle::default()),
        metrics,
        stack: Arc::new(ArcSwap::from_pointee(placeholder_stack())),
        outbound_stack: Arc::new(ArcSwap::from_pointee(placeholder_stack())),
        tls: arc_swap::ArcSwapOption::new(tls.map(Arc::new)),
        listening: AtomicBool::new(false),
        rediscover: tokio::sync::Notify::new(),
        outbound_rediscover: tokio::sync::Notify::new(),
        clock,
        reload_lock: tokio::sync::Mutex::new(()),
        load_shed: std::sync::Mutex::new(None),
        gateway,
        outbound: std::sync::OnceLock::new(),
        mcp_sessions,
        in_flight: Arc::default(),
    });
    shared.stack.store(Arc::new(build_stack(&cfg, &shared)));
    let outbound = match (&c.outbound, &shared.gateway) {
        (Some(o), Some(gateway)) => {
            let ob = Arc::new(Outbound::new(&cfg, gateway, shared.peers.clone())?);
            let _ = shared.outbound.set(ob.clone());
            shared
                .outbound_stack
                .store(Arc::new(build_outbound_stack(&cfg, &shared, ob.clone())));
            claim_socket_path(&o.socket, "outbound socket")?;
            if let Some(dir) = o.socket.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let l = UnixListener::bind(&o.socket).map_err(|source| StartError::Bind {
                what: "outbound socket",
                address: o.socket.display().to_string(),
                source,
            })?;
            set_mode(&o.socket, 0o660).map_err(|source| StartError::Bind {
                what: "outbound socket (mode)",
                address: o.socket.display().to_string(),
                source,
            })?;
            Some((l, ob))
        }
        _ => None,
    };

    // Bind everything before serving anything.
    let unix = match &c.listeners.unix {
        Some(u) => {
            claim_socket_path(&u.path, "unix listener")?;
            if let Some(dir) = u.path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let l = UnixListener::bind(&u.path).map_err(|source| StartError::Bind {
                what: "unix listener",
                address: u.path.display().to_string(),
                source,
            })?;
            set_mode(&u.path, cfg.unix_mode).map_err(|source| StartError::Bind {
                what: "unix listener (mode)",
                address: u.path.display().to_string(),
                source,
            })?;
            Some((l, u.path.clone()))
        }
        None => None,
    };
    let tcp = match cfg.tcp_address {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|source| StartError::Bind {
                    what: "tcp listener",
                    address: a.to_string(),
                    source,
                })?,
        ),
        None => None,
    };
    let ops = match cfg.ops_address {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|source| StartError::Bind {
                    what: "ops listener",
                    address: a.to_string(),
                    source,
                })?,
        ),
        None => None,
    };
    let pairing = match (cfg.pairing_address, &c.pairing, host) {
        (Some(a), Some(p), Some(host)) => {
            let l = TcpListener::bind(a)
                .await
                .map_err(|source| StartError::Bind {
                    what: "pairing listener",
                    address: a.to_string(),
                    source,
                })?;
            let init_nonces = Arc::new(NonceStore::open(
                NonceStoreConfig {
                    capacity: 100_000,
                    ttl: crate::pairing::handshake::MAX_INIT_SKEW * 3,
                    journal: Some(c.state_dir.join("pair_init.journal")),
                },
                (shared.clock)(),
            )?);
            let mut endpoint = crate::pairing::transport::PairingEndpoint::new(
                RemoteConfig {
                    component_type: "tool_host".into(),
                    component_id: p.component_id.clone(),
                    gateway_public_key_ed25519: p.gateway_public_key_ed25519.clone(),
                    endpoint_tls_fingerprint: String::new(),
                },
                host,
                init_nonces,
                p.path.clone(),
                Arc::new(ToolHostInstaller {
                    shared: shared.clone(),
                }),
            );
            if let Some(tls) = &p.tls {
                let certs = crate::tls::load_certs(&tls.cert_file)?;
                let key = crate::tls::load_key(&tls.key_file)?;
                endpoint = endpoint
                    .with_tls(certs, key)
                    .map_err(|e| StartError::Bind {
                        what: "pairing listener (TLS)",
                        address: a.to_string(),
                        source: std::io::Error::other(e.to_string()),
                    })?;
            }
            Some((l, Arc::new(endpoint)))
        }
        _ => None,
    };
    let admin_path = cfg.admin_socket();
    claim_socket_path(&admin_path, "admin socket")?;
    let admin = UnixListener::bind(&admin_path).map_err(|source| StartError::Bind {
        what: "admin socket",
        address: admin_path.display().to_string(),
        source,
    })?;
    set_mode(&admin_path, 0o600).map_err(|source| StartError::Bind {
        what: "admin socket (mode)",
        address: admin_path.display().to_string(),
        source,
    })?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let graceful = Arc::new(tokio::sync::Mutex::new(Some(GracefulShutdown::new())));
    let mut tasks = tokio::task::JoinSet::new();
    let tcp_address = tcp.as_ref().and_then(|l| l.local_addr().ok());
    let ops_address = ops.as_ref().and_then(|l| l.local_addr().ok());
    let max_conns = c.limits.max_connections;
    if let Some((l, path)) = unix {
        tracing::info!("listening unix={}", path.display());
        tasks.spawn(crate::listener::accept_unix(
            l,
            shared.clone(),
            shared.stack.clone(),
            shutdown_rx.clone(),
            graceful.clone(),
            max_conns,
        ));
    }
    if let Some(l) = tcp {
        tracing::info!("listening tcp={}", tcp_address.expect("bound"));
        tasks.spawn(crate::listener::accept_tcp(
            l,
            shared.clone(),
            shutdown_rx.clone(),
            graceful.clone(),
        ));
    }
    if let Some(l) = ops {
        let a = ops_address.expect("bound");
        if !a.ip().is_loopback() {
            tracing::warn!("ops endpoint on non-loopback address {a}: metrics are unauthenticated");
        }
        tracing::info!("ops listening on {a}");
        tasks.spawn(crate::ops::endpoint::serve(
            l,
            shared.clone(),
            shutdown_rx.clone(),
        ));
    }
    if let Some((l, ob)) = outbound {
        tracing::info!(
            "outbound socket {}",
            c.outbound.as_ref().expect("set").socket.display()
        );
        tasks.spawn(crate::listener::accept_unix(
            l,
            shared.clone(),
            shared.outbound_stack.clone(),
            shutdown_rx.clone(),
            graceful.clone(),
            max_conns,
        ));
        tasks.spawn(outbound_discovery(ob, shared.clone(), shutdown_rx.clone()));
    }
    let pairing_address = pairing.as_ref().and_then(|(l, _)| l.local_addr().ok());
    if let Some((l, endpoint)) = pairing {
        tracing::info!(
            "pairing endpoint on ws://{}",
            pairing_address.expect("bound")
        );
        tasks.spawn(endpoint.serve(l, shutdown_rx.clone()));
    }
    tasks.spawn(crate::ops::admin::serve(
        admin,
        shared.clone(),
        shutdown_rx.clone(),
    ));
    tasks.spawn(discovery_loop(shared.clone(), shutdown_rx.clone()));
    tasks.spawn(housekeeping(shared.clone(), shutdown_rx.clone()));
    shared.listening.store(true, Ordering::Release);

    Ok(Running {
        shared,
        tcp_address,
        ops_address,
        pairing_address,
        unix_path: cfg.config.listeners.unix.as_ref().map(|u| u.path.clone()),
        admin_socket: admin_path,
        shutdown: shutdown_tx,
        tasks,
        graceful,
    })
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

async fn discovery_loop(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut failures = 0u32;
    loop {
        let cfg = shared.config.load_full();
        let app = shared.app.load_full();
        let disabled = shared.kill_switch.global_engaged();
        let refreshed = tokio::select! {
            r = shared.catalog.refresh(&app, &cfg, disabled) => r,
            _ = shutdown.changed() => return,
        };
        let ok = match refreshed {
            Ok(n) => {
                shared.metrics.tools.set(n as i64);
                failures = 0;
                true
            }
            Err(_) => {
                failures += 1;
                false
            }
        };
        shared.metrics.discovery(ok);
        // Retry quickly until the first success, then at the configured interval.
        let wait = if !shared.catalog.discovered() || !ok {
            Duration::from_millis(500 * u64::from(failures.min(10)))
        } else if cfg.config.app.discovery.interval_s == 0 {
            Duration::from_secs(u64::MAX / 4)
        } else {
            Duration::from_secs(cfg.config.app.discovery.interval_s)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.rediscover.notified() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Rediscover the outbound peers' tools: every second until some are found, then at the
/// configured interval (and at once after a pairing or reload).
async fn outbound_discovery(
    outbound: Arc<Outbound>,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let cfg = shared.config.load_full();
        let n = tokio::select! {
            n = outbound.refresh(&cfg) => n,
            _ = shutdown.changed() => return,
        };
        let interval = cfg
            .config
            .outbound
            .as_ref()
            .map_or(60, |o| o.discovery_interval_s.max(1));
        let wait = if n == 0 { 1 } else { interval };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(wait)) => {}
            _ = shared.outbound_rediscover.notified() => {}
            _ = shutdown.changed() => return,
        }
    }
}

async fn housekeeping(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        match shared.peers.reload_if_changed() {
            Ok(true) => {
                tracing::info!("peer store reloaded records={}", shared.peers.len());
                shared.metrics.peers.set(shared.peers.len() as i64);
            }
            Ok(false) => {}
            Err(e) => tracing::error!("peer store kept as it was: {e}"),
        }
        if let Some(n) = &shared.nonces {
            n.purge_expired((shared.clock)());
            shared.metrics.nonce_entries.set(n.len() as i64);
        }
        peer_housekeeping(&shared);
    }
}

/// Write when peers were last seen (throttled by the store), refresh the certificate expiry
/// gauge and warn, once a day per peer, of certificates about to expire.
fn peer_housekeeping(shared: &Shared) {
    let now = (shared.clock)();
    if let Err(e) = shared.peers.flush_seen(now) {
        tracing::error!("last_seen_at not written: {e}");
    }
    let days = shared.peers.certificate_expiry_days(now);
    shared.metrics.peer_certificate_expiry(&days);
    for (id, days) in shared.peers.expiry_warnings_due(&days, now) {
        tracing::warn!("peer_certificate_expiring component_id={id} days={days}");
    }
}

/// Installs what a pairing issued on this tool host: the certificate files before the
/// install is confirmed, the new listener TLS and the gateway's peer record once the gateway
/// said the pairing is complete.
struct ToolHostInstaller {
    shared: Arc<Shared>,
}

impl crate::pairing::transport::PairingSink for ToolHostInstaller {
    fn install(&self, i: &Installed) -> Result<(), String> {
        let cfg = self.shared.config.load();
        let files = crate::tls::PairedFiles::of(&cfg.config.state_dir, &i.pairing_id)
            .map_err(|e| e.to_string())?;
        let write = |path: &Path, bytes: &[u8]| {
            carapace_filters::state_file::write_atomically(path, bytes)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        // A directory of its own: nothing in use changes until `activate` points at it.
        write(&files.key, i.key_pem.as_bytes())?;
        write(&files.cert, i.certificate_pem.as_bytes())?;
        write(&files.ca, i.chain_pem.concat().as_bytes())?;
        Ok(())
    }

    fn activate(&self, i: &Installed) -> Result<(), String> {
        let cfg = self.shared.config.load();
        let state_dir = &cfg.config.state_dir;
        let files =
            crate::tls::PairedFiles::of(state_dir, &i.pairing_id).map_err(|e| e.to_string())?;
        // Check that the new TLS builds before anything changes.
        let tls_config = cfg
            .config
            .listeners
            .tcp
            .as_ref()
            .and_then(|t| t.tls.as_ref())
            .ok_or("no TLS listener to install the pairing on")?;
        let tls = crate::tls::listener_tls(tls_config, Some(&files)).map_err(|e| e.to_string())?;
        let ca_fingerprint = tls
            .client_ca_fingerprint
            .clone()
            .ok_or("the installed gateway CA is not a single certificate")?;
        // 1. The gateway's record: unusable until the listener trusts the gateway CA.
        let paired_at =
            crate::pairing::wire::GoTime::from_system_time(std::time::SystemTime::now())
                .and_then(|t| t.to_rfc3339_nano());
        let record = crate::peers::PeerRecord {
            component_type: "gateway".into(),
            component_id: i.gateway_id.clone(),
            role: Some("gateway".into()),
            endpoint: None,
            public_key_ed25519: Some(i.gateway_public_key_ed25519.clone()),
            public_key_x25519: None,
            mtls_cert_fingerprint: String::new(),
            mtls_ca_fingerprint: Some(ca_fingerprint),
            mtls_cert_not_after: None,
            status: "active".into(),
            paired_at,
            last_seen_at: None,
            policy: None,
        };
        self.shared
            .peers
            .modify(|f| {
                f.version = 1;
                f.peers.retain(|p| p.component_id != record.component_id);
                f.peers.push(record);
            })
            .map_err(|e| e.to_string())?;
        // 2. Make this pairing the current one (one atomic write); 3. serve it.
        carapace_filters::state_file::write_atomically(
            &crate::tls::PairedFiles::current_pointer(state_dir),
            i.pairing_id.as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        self.shared.tls.store(Some(Arc::new(tls)));
        self.shared
            .metrics
            .peers
            .set(self.shared.peers.len() as i64);
        Ok(())
    }

    fn abandon(&self, pairing_id: &str) {
        let cfg = self.shared.config.load();
        crate::tls::PairedFiles::discard(&cfg.config.state_dir, pairing_id);
    }
}
