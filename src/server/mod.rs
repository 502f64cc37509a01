//! The running sidecar: the state shared by listeners and operations, start (stores,
//! identities, listeners, background tasks) and drain. The stacks are built by the
//! [`inbound`](crate::inbound) and [`outbound`](crate::outbound) roles.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use carapace_filters::signature::UnixClock;
use http::Request;
use tokio::sync::watch;

use crate::caller_body::CallerBody;
use crate::config::{Loaded, Protocol};
/// The service every listener hands requests to.
pub use crate::edge::HttpStack;
use crate::edge::{edge, PanicAnswer};
use crate::errors::ToolsV1Answers;
use crate::front::Resp;
pub use crate::inbound::build_stack;
pub use crate::ops::reload::reload;

mod bind;
pub(crate) mod drain;
mod error;
mod files;
pub(crate) mod shared;
mod start;
mod tasks;
mod workers;

pub use error::StartError;
pub use shared::Shared;
pub use workers::{index as worker_index, Workers};

/// Stands in until the real stack is built, before anything listens.
fn placeholder_stack() -> HttpStack {
    let never = tower::service_fn(|_: Request<CallerBody>| async {
        unreachable!("replaced before listening")
    });
    let panic = PanicAnswer {
        front: Protocol::ToolsV1,
        answers: ToolsV1Answers::default(),
    };
    edge::<_>(
        tower::util::MapResponse::new(never, |r: Resp| r),
        panic,
        None,
    )
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
    /// The bound address of the outbound role's endpoint for remote agents.
    pub outbound_address: Option<SocketAddr>,
    pub unix_path: Option<PathBuf>,
    pub admin_socket: PathBuf,
    shutdown: watch::Sender<bool>,
    tasks: tokio::task::JoinSet<()>,
    drain: Arc<tokio::sync::Mutex<Option<drain::Drain>>>,
}

impl Running {
    /// Stop accepting, let calls in flight finish (up to the drain timeout), then return.
    pub async fn shutdown(mut self) {
        let timeout = Duration::from_secs(self.shared.config.load().config.limits.drain_timeout_s);
        let _ = self.shutdown.send(true);
        // Accept loops end first, so no new connection is watched after this point.
        while let Some(r) = self.tasks.join_next().await {
            if let Err(e) = r {
                if e.is_panic() {
                    tracing::error!("task panicked: {e}");
                }
            }
        }
        let drain = self.drain.lock().await.take();
        if let Some(drain) = drain {
            if tokio::time::timeout(timeout, drain.shutdown())
                .await
                .is_err()
            {
                tracing::warn!("drain timeout elapsed; closing remaining connections");
            }
        }
        self.shared.workers.stop().await;
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_file(&self.admin_socket);
        if let Some(ledger) = &self.shared.ledger {
            if !ledger.flush(Duration::from_secs(5)).await {
                tracing::warn!("ledger: entries still queued at stop were not written");
            }
        }
        tracing::info!("stopped");
    }

    /// Re-read the configuration file and apply it atomically; a bad file is refused.
    pub async fn reload(&self) -> Result<(), Vec<String>> {
        reload(&self.shared).await
    }
}

/// Start everything: state, stores, listeners, discovery. Nothing is bound if the state
/// cannot be loaded. Every connection is served on the runtime this runs on.
pub async fn start(cfg: Loaded) -> Result<Running, StartError> {
    start_with_clock(cfg, Arc::new(carapace_filters::unix_now_ms)).await
}

/// [`start`] with an injected wall clock (Unix milliseconds).
pub async fn start_with_clock(cfg: Loaded, clock: UnixClock) -> Result<Running, StartError> {
    start::start(cfg, clock, Workers::one()).await
}

/// [`start`] with connections spread over `workers` (stopped after the drain).
pub async fn start_on(cfg: Loaded, workers: Workers) -> Result<Running, StartError> {
    start::start(cfg, Arc::new(carapace_filters::unix_now_ms), workers).await
}
