//! Binding the listeners and sockets at start, before anything is served.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use carapace_filters::nonce::{NonceStore, NonceStoreConfig};
use tokio::net::{TcpListener, UnixListener};

use super::error::StartError;
use super::files::{claim_socket_path, set_mode};
use super::shared::Shared;
use crate::config::{Loaded, PairingConfig};
use crate::inbound::installer::ToolHostInstaller;
use crate::pairing::handshake::RemoteConfig;
use crate::pairing::identity::HostIdentity;
use crate::pairing::transport::PairingEndpoint;

/// A Unix socket at `path` with `mode`, after removing a stale socket file there (and, with
/// `create_parent`, creating its directory). `what`: how a failure to bind and to set the
/// mode are named.
pub(super) fn bind_unix_socket(
    path: &Path,
    mode: u32,
    create_parent: bool,
    what: (&'static str, &'static str),
) -> Result<UnixListener, StartError> {
    claim_socket_path(path, what.0)?;
    if create_parent {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
    }
    let l = UnixListener::bind(path).map_err(|source| StartError::Bind {
        what: what.0,
        address: path.display().to_string(),
        source,
    })?;
    set_mode(path, mode).map_err(|source| StartError::Bind {
        what: what.1,
        address: path.display().to_string(),
        source,
    })?;
    Ok(l)
}

/// A TCP listener on `a`.
pub(super) async fn bind_tcp(a: SocketAddr, what: &'static str) -> Result<TcpListener, StartError> {
    TcpListener::bind(a)
        .await
        .map_err(|source| StartError::Bind {
            what,
            address: a.to_string(),
            source,
        })
}

/// The tool host's pairing endpoint, with its own replay store for `pair.init` and, when
/// configured, its own TLS certificate.
pub(super) fn pairing_endpoint(
    cfg: &Loaded,
    p: &PairingConfig,
    host: Arc<HostIdentity>,
    shared: &Arc<Shared>,
    a: SocketAddr,
) -> Result<PairingEndpoint, StartError> {
    let c = &cfg.config;
    let init_nonces = Arc::new(NonceStore::open(
        NonceStoreConfig {
            capacity: 100_000,
            ttl: crate::pairing::handshake::MAX_INIT_SKEW * 3,
            journal: Some(c.state_dir.join("pair_init.journal")),
        },
        (shared.clock)(),
    )?);
    let mut endpoint = PairingEndpoint::new(
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
    Ok(endpoint)
}
