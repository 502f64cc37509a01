//! Start in named steps: open the stores and identities, make the shared state and its stacks,
//! bind every listener, then serve. Nothing is served until everything is bound.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use carapace_filters::kill_switch::KillSwitch;
use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
use carapace_filters::signature::UnixClock;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use super::bind::{bind_tcp, bind_unix_socket, pairing_endpoint};
use super::drain::Drain;
use super::error::StartError;
use super::files::create_private_dir;
use super::shared::{switches, tls_acceptor, Shared};
use super::tasks::{discovery_loop, housekeeping, outbound_discovery};
use super::{placeholder_stack, Running, Workers};
use crate::catalog::pins::PinStore;
use crate::catalog::CatalogHandle;
use crate::config::{Loaded, Protocol, SharedStateBackend};
use crate::inbound::build_stack;
use crate::mcp::session::Sessions;
use crate::ops::metrics::Metrics;
use crate::outbound::stack::build_outbound_stack;
use crate::outbound::Outbound;
use crate::pairing::identity::{GatewayIdentity, HostIdentity};
use crate::pairing::transport::PairingEndpoint;
use crate::peers::PeerStore;
use crate::shared_state::RedisState;

/// What the state directory and the configuration's secrets give: stores and identities.
struct Stores {
    kill_switch: KillSwitch,
    redis: Option<RedisState>,
    nonces: Option<Arc<NonceStore>>,
    peers: Arc<PeerStore>,
    tls: Option<crate::tls::ListenerTls>,
    gateway: Option<Arc<GatewayIdentity>>,
    host: Option<Arc<HostIdentity>>,
    mcp_sessions: Option<Arc<Sessions>>,
    pins: PinStore,
    eat: Option<Arc<crate::eat::serve::Publisher>>,
    ledger: Option<Arc<crate::ledger::Ledger>>,
}

/// Every listener and socket, bound.
struct Bound {
    unix: Option<UnixListener>,
    tcp: Option<TcpListener>,
    ops: Option<TcpListener>,
    pairing: Option<(TcpListener, Arc<PairingEndpoint>)>,
    outbound: Option<(UnixListener, Arc<Outbound>)>,
    /// `outbound.listen`: the outbound role's endpoint for remote agents, and its TLS.
    outbound_tcp: Option<(TcpListener, Arc<crate::tls::ListenerTls>)>,
    admin: UnixListener,
}

/// Start with `clock` as the wall clock (Unix milliseconds).
pub(super) async fn start(
    cfg: Loaded,
    clock: UnixClock,
    workers: Workers,
) -> Result<Running, StartError> {
    let metrics = Arc::new(Metrics::default());
    let stores = open_stores(&cfg, &clock, &metrics).await?;
    log_start(&cfg, &stores.kill_switch);
    let host = stores.host.clone();
    let shared = shared_state(&cfg, stores, clock, metrics, workers);
    let bound = bind_listeners(&cfg, &shared, host).await?;
    Ok(serve(&cfg, shared, bound))
}

async fn open_stores(
    cfg: &Loaded,
    clock: &UnixClock,
    metrics: &Metrics,
) -> Result<Stores, StartError> {
    let c = &cfg.config;
    create_private_dir(&c.state_dir)?;
    let kill_switch = KillSwitch::open(switches(cfg), c.state_dir.join("killswitch.json"))?;
    let redis = open_redis(cfg).await?;
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
    let pins = PinStore::open(&c.state_dir).map_err(StartError::Pins)?;
    // No pairing runs yet: what unfinished ones left behind goes.
    let stale = peers.remove_all_pending()?;
    let unfinished = crate::tls::PairedFiles::remove_unfinished(&c.state_dir);
    if stale + unfinished > 0 {
        tracing::warn!("removed unfinished pairings: records={stale} directories={unfinished}");
    }
    let gateway = match &c.gateway {
        Some(g) => Some(Arc::new(GatewayIdentity::load_or_create(
            &c.state_dir,
            &g.id,
        )?)),
        None => None,
    };
    // The host's identity key signs pairing messages and receipts.
    let host = match c.pairing.is_some() || c.receipt_provider().is_some() {
        true => Some(Arc::new(HostIdentity::load_or_create(&c.state_dir)?)),
        false => None,
    };
    // The MCP front, and the outbound role's MCP endpoint, seal their session ids.
    let mcp_sessions = if c.front.protocol == Protocol::Mcp || c.outbound.is_some() {
        let key = match &cfg.mcp_session_key {
            Some(k) => k.bytes().to_vec(),
            None => crate::mcp::session::load_or_create_key(&c.state_dir)
                .map_err(StartError::McpSessionKey)?,
        };
        let mcp = c.front.mcp.clone().unwrap_or_default();
        Some(Arc::new(Sessions::new(&key, &mcp)))
    } else {
        None
    };
    let eat = crate::eat::serve::Publisher::open(cfg)?.map(Arc::new);
    let ledger = match (crate::ledger::path_of(c), &c.ledger) {
        (Some(path), Some(l)) => Some(Arc::new(crate::ledger::Ledger::open(
            &path,
            l,
            metrics.ledger.clone(),
        )?)),
        _ => None,
    };
    Ok(Stores {
        ledger,
        eat,
        kill_switch,
        redis,
        nonces,
        peers,
        tls: tls_acceptor(cfg)?,
        gateway,
        host,
        mcp_sessions,
        pins,
    })
}

/// The shared store, when configured. One that does not answer yet is not fatal: calls that
/// need it are refused until it does.
async fn open_redis(cfg: &Loaded) -> Result<Option<RedisState>, StartError> {
    let c = &cfg.config;
    let (SharedStateBackend::Redis, Some(r)) = (&c.shared_state.backend, &c.shared_state.redis)
    else {
        return Ok(None);
    };
    let redis = RedisState::new(r, cfg.redis_password.as_ref())?;
    match redis.verify().await {
        Ok(()) => tracing::info!("shared_state backend=redis usable=true"),
        Err(e) => tracing::warn!(
            "shared_state backend=redis usable=false: {e}; signed and rate-limited calls \
             are refused with DEPENDENCY_UNAVAILABLE until it is"
        ),
    }
    Ok(Some(redis))
}

/// The start markers operators and the reference tooling look for.
fn log_start(cfg: &Loaded, kill_switch: &KillSwitch) {
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
    if let Some(skill) = &cfg.config.app.skill {
        tracing::info!(
            "registry_summary skills=1 capabilities={}",
            skill.capabilities.len()
        );
    }
}

/// The state every listener and operation shares, with the inbound stack built.
fn shared_state(
    cfg: &Loaded,
    stores: Stores,
    clock: UnixClock,
    metrics: Arc<Metrics>,
    workers: Workers,
) -> Arc<Shared> {
    metrics.peers.set(stores.peers.len() as i64);
    let catalog = Arc::new(CatalogHandle::default());
    let relay = cfg.config.caller_tools.clone().map(|c| {
        let caps = cfg
            .config
            .tools
            .iter()
            .filter_map(|(name, t)| Some((name.clone(), t.timeout_ms_max?)))
            .collect();
        crate::relay::CallerTools::with_timeout_caps(c, catalog.clone(), caps)
    });
    let receipts =
        cfg.config
            .receipt_provider()
            .zip(stores.host.as_ref())
            .map(|(provider, host)| {
                let key = host.signing_key();
                Arc::new(match cfg.config.receipts_batched() {
                    true => crate::receipts::ReceiptSigner::batched(key, provider)
                        .counting(metrics.receipt_batches.clone()),
                    false => crate::receipts::ReceiptSigner::new(key, provider),
                })
            });
    let idem = &cfg.config.idempotency;
    let meter = match (&stores.ledger, cfg.config.meters()) {
        (Some(ledger), true) => Some(Arc::new(crate::metering::Meter::new(
            &ledger.spend,
            crate::ledger::store::day_of(clock()),
            Arc::new(crate::metering::LedgerOnly),
        ))),
        _ => None,
    };
    let shared = Arc::new(Shared {
        meter,
        idempotency_keys: Arc::new(crate::idempotency::LocalKeys::new(
            idem.max_entries,
            idem.max_bytes,
        )),
        ledger: stores.ledger,
        receipts,
        app: ArcSwap::from_pointee(crate::app::AppConn::connect(cfg, workers.count())),
        config: ArcSwap::from_pointee(cfg.clone()),
        kill_switch: stores.kill_switch,
        nonces: stores.nonces,
        redis: stores.redis,
        peers: stores.peers,
        catalog,
        pins: Arc::new(stores.pins.with_metrics(metrics.clone())),
        metrics,
        stack: Arc::new(ArcSwap::from_pointee(placeholder_stack())),
        outbound_stack: Arc::new(ArcSwap::from_pointee(placeholder_stack())),
        tls: arc_swap::ArcSwapOption::new(stores.tls.map(Arc::new)),
        listening: AtomicBool::new(false),
        rediscover: tokio::sync::Notify::new(),
        outbound_rediscover: tokio::sync::Notify::new(),
        clock,
        reload_lock: tokio::sync::Mutex::new(()),
        load_shed: std::sync::Mutex::new(None),
        gateway: stores.gateway,
        outbound: std::sync::OnceLock::new(),
        mcp_sessions: stores.mcp_sessions,
        in_flight: Arc::default(),
        eat: stores.eat,
        relay,
        workers,
    });
    shared.stack.store(Arc::new(build_stack(cfg, &shared)));
    shared
}

/// Bind everything before serving anything; the outbound role's stack is built here, with its
/// socket.
async fn bind_listeners(
    cfg: &Loaded,
    shared: &Arc<Shared>,
    host: Option<Arc<HostIdentity>>,
) -> Result<Bound, StartError> {
    let c = &cfg.config;
    let outbound = match (&c.outbound, &shared.gateway) {
        (Some(o), Some(gateway)) => {
            let ob = Arc::new(
                Outbound::new(cfg, gateway, shared.peers.clone(), shared.clock.clone())?
                    .with_metrics(shared.metrics.clone()),
            );
            let _ = shared.outbound.set(ob.clone());
            shared
                .outbound_stack
                .store(Arc::new(build_outbound_stack(cfg, shared, ob.clone())));
            let what = ("outbound socket", "outbound socket (mode)");
            Some((bind_unix_socket(&o.socket, 0o660, true, what)?, ob))
        }
        _ => None,
    };
    let outbound_tcp = match (
        cfg.outbound_listen,
        c.outbound.as_ref().and_then(|o| o.listen.as_ref()),
    ) {
        (Some(a), Some(l)) => {
            let certs = crate::tls::load_certs(&l.cert_file)?;
            let key = crate::tls::load_key(&l.key_file)?;
            let config = crate::tls::server_config(certs, key, None, false)?;
            let tls = crate::tls::ListenerTls {
                acceptor: tokio_rustls::TlsAcceptor::from(config),
                client_ca_fingerprint: None,
            };
            Some((bind_tcp(a, "outbound listener").await?, Arc::new(tls)))
        }
        _ => None,
    };
    let unix = match &c.listeners.unix {
        Some(u) => {
            let what = ("unix listener", "unix listener (mode)");
            Some(bind_unix_socket(&u.path, cfg.unix_mode, true, what)?)
        }
        None => None,
    };
    let tcp = match cfg.tcp_address {
        Some(a) => Some(bind_tcp(a, "tcp listener").await?),
        None => None,
    };
    let ops = match cfg.ops_address {
        Some(a) => Some(bind_tcp(a, "ops listener").await?),
        None => None,
    };
    let pairing = match (cfg.pairing_address, &c.pairing, host) {
        (Some(a), Some(p), Some(host)) => {
            let l = bind_tcp(a, "pairing listener").await?;
            Some((l, Arc::new(pairing_endpoint(cfg, p, host, shared, a)?)))
        }
        _ => None,
    };
    let what = ("admin socket", "admin socket (mode)");
    let admin = bind_unix_socket(&cfg.admin_socket(), 0o600, false, what)?;
    Ok(Bound {
        unix,
        tcp,
        ops,
        pairing,
        outbound,
        outbound_tcp,
        admin,
    })
}

/// Serve every bound listener and start the background tasks.
fn serve(cfg: &Loaded, shared: Arc<Shared>, bound: Bound) -> Running {
    let (shutdown_tx, shutdown) = watch::channel(false);
    let drain = Arc::new(tokio::sync::Mutex::new(Some(Drain::default())));
    let address = |l: Option<&TcpListener>| l.and_then(|l| l.local_addr().ok());
    let tcp_address = address(bound.tcp.as_ref());
    let outbound_address = address(bound.outbound_tcp.as_ref().map(|(l, _)| l));
    let ops_address = address(bound.ops.as_ref());
    let pairing_address = address(bound.pairing.as_ref().map(|(l, _)| l));
    let unix_path = cfg.config.listeners.unix.as_ref().map(|u| u.path.clone());
    let mut spawner = Spawner {
        tasks: tokio::task::JoinSet::new(),
        shared: shared.clone(),
        shutdown,
        drain: drain.clone(),
        max_conns: cfg.config.limits.max_connections,
    };
    if let (Some(l), Some(path)) = (bound.unix, &unix_path) {
        tracing::info!("listening unix={}", path.display());
        spawner.unix(l, spawner.shared.stack.clone());
    }
    if let Some(l) = bound.tcp {
        tracing::info!("listening tcp={}", tcp_address.expect("bound"));
        spawner.tcp(l, crate::listener::TcpEndpoint::Inbound);
    }
    if let Some((l, tls)) = bound.outbound_tcp {
        let a = outbound_address.expect("bound");
        tracing::info!("outbound listening tcp={a}");
        spawner.tcp(l, crate::listener::TcpEndpoint::Outbound(tls));
    }
    if let (Some((l, outbound)), Some(o)) = (bound.outbound, &cfg.config.outbound) {
        tracing::info!("outbound socket {}", o.socket.display());
        spawner.unix(l, spawner.shared.outbound_stack.clone());
        let task = outbound_discovery(outbound, shared.clone(), spawner.shutdown.clone());
        spawner.tasks.spawn(task);
    }
    spawner.ops(bound.ops, bound.pairing, bound.admin);
    shared.listening.store(true, Ordering::Release);
    Running {
        shared,
        tcp_address,
        ops_address,
        pairing_address,
        outbound_address,
        unix_path,
        admin_socket: cfg.admin_socket(),
        shutdown: shutdown_tx,
        tasks: spawner.tasks,
        drain,
    }
}

/// Starts the accept loops and background tasks of a running carapace, with what they share.
struct Spawner {
    tasks: tokio::task::JoinSet<()>,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
    drain: Arc<tokio::sync::Mutex<Option<Drain>>>,
    max_conns: usize,
}

impl Spawner {
    /// Calls on a Unix socket, into `stack`.
    fn unix(&mut self, l: UnixListener, stack: Arc<ArcSwap<crate::edge::HttpStack>>) {
        self.tasks.spawn(crate::listener::accept_unix(
            l,
            self.shared.clone(),
            stack,
            self.shutdown.clone(),
            self.drain.clone(),
            self.max_conns,
        ));
    }

    /// Calls on a TCP listener (TLS when configured), to the inbound or the outbound stack.
    fn tcp(&mut self, l: TcpListener, endpoint: crate::listener::TcpEndpoint) {
        self.tasks.spawn(crate::listener::accept_tcp(
            l,
            endpoint,
            self.shared.clone(),
            self.shutdown.clone(),
            self.drain.clone(),
        ));
    }

    /// The ops endpoint, the pairing endpoint, the admin socket and the background tasks.
    fn ops(
        &mut self,
        ops: Option<TcpListener>,
        pairing: Option<(TcpListener, Arc<PairingEndpoint>)>,
        admin: UnixListener,
    ) {
        let (shared, shutdown) = (&self.shared, &self.shutdown);
        if let Some(l) = ops {
            if let Ok(a) = l.local_addr() {
                if !a.ip().is_loopback() {
                    tracing::warn!(
                        "ops endpoint on non-loopback address {a}: metrics are unauthenticated"
                    );
                }
                tracing::info!("ops listening on {a}");
            }
            let task = crate::ops::endpoint::serve(l, shared.clone(), shutdown.clone());
            self.tasks.spawn(task);
        }
        if let Some((l, endpoint)) = pairing {
            if let Ok(a) = l.local_addr() {
                tracing::info!("pairing endpoint on ws://{a}");
            }
            self.tasks.spawn(endpoint.serve(l, shutdown.clone()));
        }
        let admin = crate::ops::admin::serve(admin, shared.clone(), shutdown.clone());
        self.tasks.spawn(admin);
        self.tasks
            .spawn(discovery_loop(shared.clone(), shutdown.clone()));
        self.tasks
            .spawn(housekeeping(shared.clone(), shutdown.clone()));
    }
}
