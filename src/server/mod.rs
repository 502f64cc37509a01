//! The running sidecar: the state shared by listeners and operations, start (stores,
//! identities, listeners, background tasks) and drain. The stacks are built by the
//! [`inbound`](crate::inbound) and [`outbound`](crate::outbound) roles.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bind::{bind_tcp, bind_unix_socket, pairing_endpoint};
use carapace_filters::kill_switch::KillSwitch;
use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
use carapace_filters::signature::UnixClock;
use files::create_private_dir;
use http::Request;
use hyper_util::server::graceful::GracefulShutdown;
use tasks::{discovery_loop, housekeeping, outbound_discovery};
use tokio::sync::watch;

use crate::caller_body::CallerBody;
use crate::catalog::CatalogHandle;
use crate::config::{Loaded, Protocol, SharedStateBackend};
/// The service every listener hands requests to.
pub use crate::edge::HttpStack;
use crate::edge::{edge, PanicAnswer};
use crate::errors::ToolsV1Answers;
use crate::front::Resp;
pub use crate::inbound::build_stack;
use crate::ops::metrics::Metrics;
pub use crate::ops::reload::reload;
use crate::outbound::stack::build_outbound_stack;
use crate::outbound::Outbound;
use crate::pairing::identity::{GatewayIdentity, HostIdentity};
use crate::peers::PeerStore;
use crate::shared_state::RedisState;

mod bind;
mod error;
mod files;
pub(crate) mod shared;
mod tasks;

pub use error::StartError;
pub use shared::Shared;
use shared::{app_client, switches, tls_acceptor};

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
            let l = bind_unix_socket(
                &o.socket,
                0o660,
                true,
                ("outbound socket", "outbound socket (mode)"),
            )?;
            Some((l, ob))
        }
        _ => None,
    };

    // Bind everything before serving anything.
    let unix = match &c.listeners.unix {
        Some(u) => Some((
            bind_unix_socket(
                &u.path,
                cfg.unix_mode,
                true,
                ("unix listener", "unix listener (mode)"),
            )?,
            u.path.clone(),
        )),
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
            Some((l, Arc::new(pairing_endpoint(&cfg, p, host, &shared, a)?)))
        }
        _ => None,
    };
    let admin_path = cfg.admin_socket();
    let admin = bind_unix_socket(
        &admin_path,
        0o600,
        false,
        ("admin socket", "admin socket (mode)"),
    )?;

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
