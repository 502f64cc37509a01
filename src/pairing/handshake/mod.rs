//! The pairing handshake, phases 1 to 7, as two state machines without I/O: the tool-host
//! side ([`RemoteHandshake`]) and the gateway side ([`GatewayHandshake`]). Each takes the
//! text of one received message and returns the texts to send, so the same code runs over a
//! WebSocket, in tests against the crabstack transcript, or against each other in memory.
//!
//! Every failure is a [`HandshakeError`]; a side that fails stops (the transport closes, the
//! tool host may first send `pair.error`). Nothing is installed or recorded before the last
//! check of its phase passed.

use std::time::{Duration, SystemTime};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::wire::{GoTime, WireError, WireMessage};

mod remote;
pub use remote::{Installed, Progress, RemoteConfig, RemoteHandshake};
mod gateway;
pub use gateway::{GatewayHandshake, PairRequest, PairedPeer};
#[cfg(test)]
mod tests;

/// How far `pair.init`'s `issued_at` may be from the tool host's clock.
pub const MAX_INIT_SKEW: Duration = Duration::from_secs(120);
/// Lifetime of an issued mTLS certificate.
pub const CERTIFICATE_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Issued certificates start this long before issuance (clock skew between peers).
pub const BACKDATE: Duration = Duration::from_secs(300);

/// Why a handshake stopped.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("pairing protocol violation: {0}")]
    Protocol(String),
    #[error("pair.init issued_at {0} is outside the accepted window")]
    StaleInit(String),
    #[error("pair.init nonce was already used")]
    ReplayedInit,
    #[error("challenge mismatch")]
    ChallengeMismatch,
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("mtls certificate fingerprint mismatch")]
    FingerprintMismatch,
    #[error("remote returned pair.error: {code} {message}")]
    Remote { code: String, message: String },
    #[error("replay store: {0}")]
    Store(String),
}

/// Peer-supplied text for logs and errors: bounded, one line, no control characters.
pub(crate) fn sanitized(text: &str) -> String {
    text.chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Whether `id` has the form crabstack gives a pairing id: 32 lowercase hex characters (16
/// random bytes). The tool host names a directory after it, so nothing else is accepted.
pub fn is_valid_pairing_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `id` can name a peer (a gateway id sent by a gateway): 1 to 64 of `A-Z a-z 0-9 . _
/// -`, not `.` or `..`, and not one of the ids carapace gives its own principals.
pub fn is_valid_peer_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && id != "."
        && id != ".."
        && !crate::peers::RESERVED_IDS.contains(&id)
}

fn violation(m: impl Into<String>) -> HandshakeError {
    HandshakeError::Protocol(m.into())
}

fn same_pairing(expected: &str, got: &str) -> Result<(), HandshakeError> {
    if expected == got {
        Ok(())
    } else {
        Err(violation(format!(
            "pairing_id {} does not match {expected}",
            sanitized(got)
        )))
    }
}

fn wire<M: WireMessage>(m: &M) -> Result<String, HandshakeError> {
    Ok(m.to_wire()?)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn go_time(t: SystemTime) -> Result<String, HandshakeError> {
    GoTime::from_system_time(t)
        .and_then(|g| g.to_rfc3339_nano())
        .ok_or_else(|| violation("time out of range"))
}

/// The one certificate of a PEM string.
fn single_cert(pem: &str) -> Result<CertificateDer<'static>, HandshakeError> {
    let mut it = CertificateDer::pem_slice_iter(pem.as_bytes());
    let cert = it
        .next()
        .ok_or_else(|| HandshakeError::Certificate("no certificate in PEM".into()))?
        .map_err(|e| HandshakeError::Certificate(e.to_string()))?;
    if it.next().is_some() {
        return Err(HandshakeError::Certificate(
            "more than one certificate in PEM".into(),
        ));
    }
    Ok(cert)
}
