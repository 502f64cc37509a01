//! The state shared by listeners, the admin socket, the ops endpoint and reloads, and what
//! start and reload both build from a configuration.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use carapace_filters::concurrency::LoadShedLayer;
use carapace_filters::kill_switch::{KillSwitch, Switches};
use carapace_filters::nonce::NonceStore;
use carapace_filters::signature::UnixClock;

use super::error::StartError;
use crate::catalog::CatalogHandle;
use crate::config::Loaded;
use crate::edge::HttpStack;
use crate::ops::metrics::Metrics;
use crate::outbound::Outbound;
use crate::peers::PeerStore;
use crate::shared_state::RedisState;

/// State shared by listeners, the admin socket, the ops endpoint and reloads.
pub struct Shared {
    pub config: ArcSwap<Loaded>,
    pub kill_switch: KillSwitch,
    pub nonces: Option<Arc<NonceStore>>,
    /// The store shared by the replicas, with `shared_state.backend: redis`.
    pub redis: Option<RedisState>,
    pub peers: Arc<PeerStore>,
    pub catalog: Arc<CatalogHandle>,
    /// Tool-definition pins recorded at first discovery and by approvals.
    pub pins: Arc<crate::catalog::pins::PinStore>,
    pub metrics: Arc<Metrics>,
    pub app: ArcSwap<crate::app::AppConn>,
    pub(crate) stack: Arc<ArcSwap<HttpStack>>,
    /// The outbound role's stack (serves only when `outbound` is configured).
    pub(crate) outbound_stack: Arc<ArcSwap<HttpStack>>,
    pub(crate) tls: arc_swap::ArcSwapOption<crate::tls::ListenerTls>,
    pub(super) listening: AtomicBool,
    pub(super) rediscover: tokio::sync::Notify,
    pub(super) outbound_rediscover: tokio::sync::Notify,
    /// Wall clock for signature windows and nonce expiry (injected in tests).
    pub clock: UnixClock,
    /// Serializes reloads (SIGHUP and the admin socket).
    pub(crate) reload_lock: tokio::sync::Mutex<()>,
    /// The concurrency limit, kept across reloads so calls in flight keep counting.
    pub(super) load_shed: std::sync::Mutex<Option<(usize, LoadShedLayer)>>,
    /// Gateway role: its identity and pairing CA.
    pub gateway: Option<Arc<crate::pairing::identity::GatewayIdentity>>,
    /// The outbound role, when configured (pairings confirm through it).
    pub outbound: std::sync::OnceLock<Arc<Outbound>>,
    /// The MCP front's sessions (older protocol era), when the front is MCP.
    pub mcp_sessions: Option<Arc<crate::mcp::session::Sessions>>,
    /// Calls in flight that their callers may cancel (kept across reloads).
    pub in_flight: Arc<crate::in_flight::InFlightCalls>,
    /// `front.eat`: the catalog's signing keys and signatures.
    pub eat: Option<Arc<crate::eat::serve::Publisher>>,
    /// `caller_tools`: the tools connected callers offer.
    pub relay: Option<Arc<crate::relay::CallerTools>>,
    /// `receipts`: the host's key and name, signing a receipt for every executed call.
    pub receipts: Option<Arc<crate::receipts::ReceiptSigner>>,
    /// `ledger`: every call, recorded.
    pub ledger: Option<Arc<crate::ledger::Ledger>>,
    /// Idempotency keys of this process (with Redis, the keys live there).
    pub idempotency_keys: Arc<crate::idempotency::LocalKeys>,
    /// What each consumer of priced tools spent (with prices or `metering`).
    pub meter: Option<Arc<crate::metering::Meter>>,
    /// The event loops serving connections.
    pub workers: super::Workers,
}

impl Shared {
    /// The concurrency limit: the same permits as before unless the limit changed.
    pub(crate) fn load_shed_layer(&self, max: usize) -> LoadShedLayer {
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

pub(crate) fn tls_acceptor(cfg: &Loaded) -> Result<Option<crate::tls::ListenerTls>, StartError> {
    let tls = cfg
        .config
        .listeners
        .tcp
        .as_ref()
        .and_then(|t| t.tls.as_ref());
    match tls {
        Some(tls) => {
            let paired = crate::tls::PairedFiles::current(&cfg.config.state_dir);
            let optional = cfg.config.front.authenticates_each_request();
            Ok(Some(crate::tls::listener_tls(
                tls,
                paired.as_ref(),
                optional,
            )?))
        }
        None => Ok(None),
    }
}

pub(crate) fn switches(cfg: &Loaded) -> Switches {
    Switches {
        global: cfg.config.kill_switch.global,
        tools: cfg.config.kill_switch.tools.iter().cloned().collect(),
    }
}
