//! The gateway's side of a pairing around the handshake: the peer is recorded `pending`
//! before `pair.complete` is sent, and made `active` only once the gateway has seen the peer
//! activate the pairing; otherwise the record is removed and the pairing reported as not
//! confirmed. So the gateway never reports a success it has not seen (a tool host that dies
//! after `pair.csr_installed` never activated anything), and a pairing it reports is usable
//! at once (its tools are discovered through the issued certificate before it answers).
//!
//! Evidence of activation: for a tool host the gateway calls (`outbound.peers`), a
//! `GET /v1/tools` over mTLS that pins the issued certificate, which only a tool host that
//! switched to it can answer; for any other peer, the WebSocket close a carapace tool host
//! sends once it has activated (a `pair.error`, a reset or silence is not).

use std::sync::Arc;

use super::handshake::{PairRequest, PairedPeer};
use super::identity::GatewayIdentity;
use super::transport::{Completed, Ending, PairingError};
use crate::peers::{PeerRecord, PeerStore};
use crate::server::shared::Shared;

/// A pending record that is removed when dropped unless it was activated: on failure, and
/// when the pairing request is abandoned (its task dropped).
struct Pending {
    peers: Arc<PeerStore>,
    component_id: String,
    fingerprint: String,
    armed: bool,
}

impl Pending {
    /// Make the record active (the peer's only record).
    fn activate(mut self) -> Result<PeerRecord, PairingError> {
        let record = self
            .peers
            .activate_pending(&self.component_id, &self.fingerprint)
            .map_err(|e| PairingError::Install(format!("recording the peer: {e}")))?
            .ok_or_else(|| PairingError::Install("the pending record disappeared".into()))?;
        self.armed = false;
        Ok(record)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Err(e) = self
            .peers
            .remove_pending(&self.component_id, &self.fingerprint)
        {
            tracing::error!("pending record of {} not removed: {e}", self.component_id);
        }
    }
}

/// The record of a peer that completed the handshake, before it is confirmed.
fn pending_record(shared: &Shared, peer: &PairedPeer) -> Result<PeerRecord, String> {
    // Re-pairing an active peer must not change who it is: same key, or revoke it first.
    if let Some(existing) = shared.peers.active(&peer.component_id) {
        if existing.public_key_ed25519.as_deref() != Some(peer.public_key_ed25519.as_str()) {
            return Err(format!(
                "{} is paired with another key; revoke it before pairing it again",
                peer.component_id
            ));
        }
    }
    // The operator's role and policy for this peer outlive its certificate (a renewal, or a
    // new key after a revocation).
    let (role, policy) = shared
        .peers
        .settings_of(&peer.component_id)
        .map(|p| (p.role, p.policy))
        .unwrap_or_default();
    Ok(PeerRecord {
        component_type: peer.component_type.clone(),
        component_id: peer.component_id.clone(),
        role,
        endpoint: Some(peer.endpoint.clone()),
        public_key_ed25519: Some(peer.public_key_ed25519.clone()),
        public_key_x25519: Some(peer.public_key_x25519.clone()),
        mtls_cert_fingerprint: peer.mtls_cert_fingerprint.clone(),
        mtls_ca_fingerprint: None,
        mtls_cert_not_after: Some(peer.mtls_cert_not_after.clone()),
        status: crate::peers::PENDING.into(),
        paired_at: Some(peer.paired_at.clone()),
        last_seen_at: Some(peer.paired_at.clone()),
        policy,
    })
}

/// Run a pairing requested by the operator; returns the peer and its `active` record once
/// the peer is seen to have activated it, else an error, with nothing recorded.
pub async fn pair_peer(
    shared: &Arc<Shared>,
    gateway: Arc<GatewayIdentity>,
    request: PairRequest,
) -> Result<(PairedPeer, PeerRecord), PairingError> {
    let pending = std::sync::Mutex::new(None);
    let record = Box::new(|peer: &PairedPeer| {
        let record =
            pending_record(shared, peer).map_err(|e| format!("recording the peer: {e}"))?;
        let (component_id, fingerprint) = (
            record.component_id.clone(),
            record.mtls_cert_fingerprint.clone(),
        );
        shared
            .peers
            .add_pending(record)
            .map_err(|e| format!("recording the peer: {e}"))?;
        let guard = Pending {
            peers: shared.peers.clone(),
            component_id,
            fingerprint,
            armed: true,
        };
        *pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
        Ok(())
    });
    let completed = crate::pairing::transport::pair(gateway, request, record).await;
    let guard = pending.lock().unwrap_or_else(|e| e.into_inner()).take();
    let completed = completed?;
    let guard = guard.ok_or_else(|| PairingError::Install("the peer was not recorded".into()))?;
    confirm(shared, &completed)
        .await
        .map_err(PairingError::Unconfirmed)?;
    let record = guard.activate()?;
    shared.metrics.peers.set(shared.peers.len() as i64);
    if let Some(outbound) = shared.outbound.get() {
        // Its tools are routed before the pairing is reported.
        outbound.refresh(&shared.config.load_full()).await;
    }
    Ok((completed.peer, record))
}

/// Whether the peer of a completed handshake activated the pairing (see the module text).
async fn confirm(shared: &Shared, completed: &Completed) -> Result<(), String> {
    let peer = &completed.peer;
    if let Ending::Refused(_) = completed.ending {
        return Err(completed.ending.to_string());
    }
    let dialed = shared
        .outbound
        .get()
        .filter(|o| peer.component_type == "tool_host" && o.dials(&peer.component_id));
    match dialed {
        Some(outbound) => outbound
            .confirm(
                &peer.component_id,
                &peer.mtls_cert_fingerprint,
                crate::outbound::CONFIRM_WINDOW,
            )
            .await
            .map_err(|e| {
                format!("the tool host did not answer discovery with the issued certificate: {e}")
            }),
        None if completed.ending == Ending::Closed => Ok(()),
        None => Err(completed.ending.to_string()),
    }
}
