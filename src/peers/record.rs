//! The peer file's format: one record per paired peer.

use carapace_filters::authorization::Policy;
use serde::{Deserialize, Serialize};

/// One paired peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRecord {
    /// `gateway`, `tool_host`, `subscriber`, `operator`, ...
    pub component_type: String,
    pub component_id: String,
    /// Authorization role (`gateway`, `tool_host`, `subscriber`, `listener`, `cli_admin`).
    #[serde(default)]
    pub role: Option<String>,
    /// Where the peer was paired (its pairing endpoint), if known.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub public_key_ed25519: Option<String>,
    #[serde(default)]
    pub public_key_x25519: Option<String>,
    /// `sha256:<hex>` of the peer's mTLS certificate DER (compared case-insensitively); `""`
    /// when the record pins a CA instead.
    #[serde(default)]
    pub mtls_cert_fingerprint: String,
    /// `sha256:<hex>` of the CA whose certificates naming `urn:carapace:gateway:<component_id>`
    /// are this peer (how a tool host knows the gateway it paired with, whose own client
    /// certificate is not part of the handshake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls_ca_fingerprint: Option<String>,
    /// RFC 3339 end of validity of the certificate `mtls_cert_fingerprint` names, when carapace
    /// knows it (the gateway records it for the certificates it issues). Calls are refused
    /// from then on, even on a connection opened before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls_cert_not_after: Option<String>,
    /// `active` records are accepted; anything else (`revoked`, `pending`) is refused.
    pub status: String,
    #[serde(default)]
    pub paired_at: Option<String>,
    #[serde(default)]
    pub last_seen_at: Option<String>,
    /// Per-peer authorization overrides: `allow`, `deny` and temporary `leases`.
    #[serde(default)]
    pub policy: Option<Policy>,
}

/// The file format.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerFile {
    pub version: u32,
    #[serde(default)]
    pub peers: Vec<PeerRecord>,
}

impl PeerRecord {
    /// Whether this is a revoked record of `component_id`, or of any id with the Ed25519 key
    /// `public_key`: that component may not pair again until the operator deletes it.
    pub fn revokes(&self, component_id: &str, public_key: Option<&str>) -> bool {
        self.status == super::REVOKED
            && (self.component_id == component_id
                || (public_key.is_some() && self.public_key_ed25519.as_deref() == public_key))
    }
}
