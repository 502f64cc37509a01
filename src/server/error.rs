//! Why starting failed.

use std::path::PathBuf;

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
    #[error("EAT catalog keys: {0}")]
    EatKeys(#[from] crate::eat::keys::KeyError),
    #[error("tool pins: {0}")]
    Pins(String),
    #[error(transparent)]
    Ledger(#[from] crate::ledger::OpenError),
    #[error("cannot bind {what} {address}: {source}")]
    Bind {
        what: &'static str,
        address: String,
        source: std::io::Error,
    },
}
