//! Background tasks: tool discovery (app and outbound peers) and housekeeping of the stores.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The service every listener hands requests to.
use super::shared::Shared;
use crate::outbound::Outbound;

/// The least time between two discoveries an MCP server's `tools/list_changed` asks for: a
/// notice after a quiet second is acted on at once; a server that sends them without pause
/// gets a discovery a second, not one per notice.
const LIST_CHANGED_MIN_GAP: Duration = Duration::from_secs(1);

pub(crate) async fn discovery_loop(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut failures = 0u32;
    let mut last_notice: Option<tokio::time::Instant> = None;
    loop {
        let cfg = shared.config.load_full();
        let app = shared.app.load_full();
        let disabled = shared.kill_switch.global_engaged();
        let refreshed = tokio::select! {
            r = shared.catalog.refresh(&app, &cfg, disabled, &shared.pins) => r,
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
        let list_changed = app.list_changed();
        let server_says = async {
            match &list_changed {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        let notified = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = shared.rediscover.notified() => false,
            _ = server_says => true,
            _ = shutdown.changed() => return,
        };
        if notified {
            tracing::info!("tools_list_changed: discovering again");
            if let Some(last) = last_notice {
                tokio::select! {
                    _ = tokio::time::sleep_until(last + LIST_CHANGED_MIN_GAP) => {}
                    _ = shutdown.changed() => return,
                }
            }
            last_notice = Some(tokio::time::Instant::now());
        }
    }
}

/// Rediscover the outbound peers' tools: every second until some are found, then at the
/// configured interval (and at once after a pairing or reload).
pub(crate) async fn outbound_discovery(
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

pub(crate) async fn housekeeping(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
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
