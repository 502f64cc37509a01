//! RFC 9421 signatures on a tools-v1 or mcp front (`front.auth.mode: http_signature`): the
//! keys (the configured `hmac-sha256` keys, then the paired peers' Ed25519 identity keys) and
//! the layer ([`carapace_filters::http_signature`]).

use std::sync::Arc;
use std::time::Duration;

use carapace_filters::http_signature::{
    HttpSignatureLayer, HttpSignaturePolicy, SignatureKeys, SignerKey, VerifyKey,
};

use crate::config::Loaded;
use crate::peers::PeerStore;
use crate::server::shared::Shared;

/// The keys a request may be signed with, by `keyid`.
pub struct FrontSigners {
    /// The configured shared keys, made ready once.
    hmac: Vec<(String, VerifyKey)>,
    peers: Arc<PeerStore>,
}

impl SignatureKeys for FrontSigners {
    fn key(&self, keyid: &str) -> Option<SignerKey> {
        if let Some((_, key)) = self.hmac.iter().find(|(id, _)| id == keyid) {
            return Some(SignerKey {
                key: key.clone(),
                principal: None,
            });
        }
        let (public, principal) = self.peers.signing_peer(keyid)?;
        Some(SignerKey {
            key: VerifyKey::Ed25519(public),
            principal: Some(principal),
        })
    }
}

/// The signature layer of a front with `auth.mode: http_signature`, else `None`.
pub fn layer(cfg: &Loaded, shared: &Shared) -> Option<HttpSignatureLayer> {
    let c = &cfg.config;
    let auth = c.front.auth.as_ref().filter(|_| c.front.http_signature())?;
    let keys = FrontSigners {
        hmac: cfg
            .caller_keys
            .iter()
            .map(|(id, s)| (id.clone(), VerifyKey::hmac_sha256(s.bytes())))
            .collect(),
        peers: shared.peers.clone(),
    };
    let tls = c.listeners.tcp.as_ref().is_some_and(|t| t.tls.is_some());
    let policy = HttpSignaturePolicy {
        skew: Duration::from_secs(auth.timestamp_skew_s),
        scheme: if tls { "https" } else { "http" },
        authorities: auth
            .authorities
            .iter()
            .map(|a| a.to_ascii_lowercase())
            .collect(),
        replay: super::call_stage::replay_guard(shared, auth.nonce_ttl_s),
    };
    Some(HttpSignatureLayer::new(
        Arc::new(keys),
        policy,
        shared.clock.clone(),
    ))
}
