//! The peer store as the identity layer's directory: certificate to principal.

use std::sync::Arc;

use carapace_filters::call::Principal;
use carapace_filters::identity::{PeerCertificate, PeerDirectory};
use carapace_filters::Rejection;

use super::{PeerStore, ACTIVE};

impl PeerDirectory for PeerStore {
    fn resolve(&self, cert: &PeerCertificate) -> Result<Arc<Principal>, Rejection> {
        let snap = self.snapshot.load();
        if snap.all.is_empty() {
            return Err(Rejection::PairingRequired);
        }
        let exact = snap.by_fingerprint.get(&*lowercase(&cert.fingerprint));
        let by_ca = || {
            let ca = cert.ca_fingerprint.as_ref()?.to_ascii_lowercase();
            snap.by_ca.get(&(ca, cert.gateway_id.clone()?))
        };
        let (entry, pinned_ca) = match exact {
            Some(e) => (e, false),
            None => match by_ca() {
                Some(e) => (e, true),
                // No record: this certificate's holder has not paired (the protocol's
                // `PAIRING_REQUIRED`); a record that is not active is `FORBIDDEN` below.
                None => return Err(Rejection::PairingRequired),
            },
        };
        if entry.0.status != ACTIVE {
            return Err(Rejection::Forbidden(format!(
                "peer {} is {}",
                entry.0.component_id, entry.0.status
            )));
        }
        // Valid through its `notAfter` second, as X.509 has it.
        if entry.2.is_some_and(|t| (self.clock)() as i64 > t) {
            return Err(Rejection::Forbidden(format!(
                "the certificate of peer {} expired at {}; pair it again",
                entry.0.component_id,
                entry.0.mtls_cert_not_after.as_deref().unwrap_or_default()
            )));
        }
        if pinned_ca {
            // Tell the app which certificate it was.
            let mut p = (*entry.1).clone();
            p.fingerprint = Some(cert.fingerprint.to_ascii_lowercase());
            return Ok(Arc::new(p));
        }
        Ok(entry.1.clone())
    }
}

/// `s` in lower case, copied only when it has an upper-case letter (fingerprints made here
/// never have one).
fn lowercase(s: &str) -> std::borrow::Cow<'_, str> {
    // Every byte looked at, without an early exit, so that the loop is vectorised: a
    // fingerprint is checked on every request.
    let upper = s.bytes().fold(false, |up, b| up | b.is_ascii_uppercase());
    match upper {
        true => std::borrow::Cow::Owned(s.to_ascii_lowercase()),
        false => std::borrow::Cow::Borrowed(s),
    }
}
