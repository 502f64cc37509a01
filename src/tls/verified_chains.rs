//! Client certificate chains that have already been verified, so a caller that reconnects with
//! the same certificate is not put through the chain's signature checks again.
//!
//! Each mTLS handshake verifies two ECDSA signatures for the client: the CA's over the
//! client's certificate (the chain) and the client's over the handshake (`CertificateVerify`,
//! proof that it holds the key). The chain's result depends only on the certificates' bytes,
//! the trusted CAs and the time, and the callers of a sidecar are a few peers reconnecting with
//! the same certificates; so [`RememberingVerifier`] keeps the chains it has seen verified,
//! keyed by a SHA-256 over every certificate the client presented, until the first of them
//! expires or [`REMEMBER_FOR`] has passed. The `CertificateVerify` signature is checked on
//! every handshake (sessions are not resumed on these listeners, so every handshake is a full
//! one), and a chain that failed is never remembered. A new trust store (a new
//! pairing, a reload) builds a new verifier, so nothing remembered outlives the CAs it was
//! verified against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::Digest as _;

/// How long a verified chain is remembered at most (its certificates' expiry may end it
/// sooner).
pub const REMEMBER_FOR: u64 = 600;

/// How many chains are remembered at most; when full, expired ones are dropped, and if none
/// had expired, one of the others.
pub const CAPACITY: usize = 1024;

/// Verified chains: SHA-256 over the presented certificates -> (verified at, valid until), in
/// Unix seconds.
#[derive(Debug, Default)]
struct VerifiedChains {
    chains: Mutex<HashMap<[u8; 32], (u64, u64)>>,
}

impl VerifiedChains {
    fn knows(&self, key: &[u8; 32], now: u64) -> bool {
        let chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        // A clock that went back is not trusted with an earlier result.
        chains
            .get(key)
            .is_some_and(|&(at, until)| at <= now && now < until)
    }

    fn remember(&self, key: [u8; 32], now: u64, until: u64) {
        let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        if chains.len() >= CAPACITY && !chains.contains_key(&key) {
            chains.retain(|_, &mut (_, u)| now < u);
            // None expired: one goes (any one; a caller churning chains only costs the others
            // a verification).
            if let Some(&any) = chains.keys().next().filter(|_| chains.len() >= CAPACITY) {
                chains.remove(&any);
            }
        }
        chains.insert(key, (now, until));
    }
}

/// A [`ClientCertVerifier`] that remembers the chains `inner` verified (see the [module
/// docs](self)); everything else is `inner`'s.
///
/// ```
/// use std::sync::Arc;
/// use carapace::tls::verified_chains::RememberingVerifier;
/// use rustls_pki_types::{pem::PemObject, CertificateDer};
///
/// let ca = carapace::pki::Authority::new("callers");
/// let mut roots = rustls::RootCertStore::empty();
/// roots.add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap()).unwrap();
/// let webpki = rustls::server::WebPkiClientVerifier::builder_with_provider(
///     Arc::new(roots),
///     carapace::tls::provider(),
/// )
/// .build()
/// .unwrap();
/// let verifier = RememberingVerifier::new(webpki);
/// # let _ = verifier;
/// ```
#[derive(Debug)]
pub struct RememberingVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    verified: VerifiedChains,
}

impl RememberingVerifier {
    pub fn new(inner: Arc<dyn ClientCertVerifier>) -> Arc<Self> {
        Arc::new(RememberingVerifier {
            inner,
            verified: VerifiedChains::default(),
        })
    }
}

/// SHA-256 over every presented certificate, each as its length (8 bytes, big-endian) and its
/// DER, so no two different chains share a key.
fn chain_key(end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>]) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    for der in std::iter::once(end_entity).chain(intermediates) {
        h.update((der.len() as u64).to_be_bytes());
        h.update(der.as_ref());
    }
    h.finalize().into()
}

/// When the first of the presented certificates expires (Unix seconds); `None` if one does not
/// parse (then the chain is not remembered).
fn first_expiry(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> Option<u64> {
    use x509_parser::prelude::FromDer;
    std::iter::once(end_entity)
        .chain(intermediates)
        .map(|der| {
            let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
            u64::try_from(cert.validity().not_after.timestamp()).ok()
        })
        .try_fold(u64::MAX, |first, t| Some(first.min(t?)))
}

impl ClientCertVerifier for RememberingVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let key = chain_key(end_entity, intermediates);
        let secs = now.as_secs();
        if self.verified.knows(&key, secs) {
            return Ok(ClientCertVerified::assertion());
        }
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        // Remembered until the first certificate expires (the moment after which the chain
        // would fail), and no longer than `REMEMBER_FOR`.
        if let Some(expiry) = first_expiry(end_entity, intermediates) {
            let until = expiry.min(secs.saturating_add(REMEMBER_FOR));
            self.verified.remember(key, secs, until);
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }
}

#[cfg(test)]
mod tests;
