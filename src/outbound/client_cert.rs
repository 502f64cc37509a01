//! The certificate the gateway presents to the tool hosts it paired: issued by its pairing CA
//! at start for a year, and issued again at half its life, so a gateway that runs for longer
//! is not refused by every tool host when the first one expires.

use std::sync::{Arc, Mutex};

use carapace_filters::signature::UnixClock;
use rustls::pki_types::CertificateDer;

use crate::pairing::identity::GatewayIdentity;

/// How long a client certificate is used before a new one is issued (it is valid a year).
pub const RENEW_AFTER_MS: u64 = 182 * 24 * 3600 * 1000;

/// One issued certificate and its key.
#[derive(Clone)]
pub struct ClientCert {
    pub cert: CertificateDer<'static>,
    pub key_pem: zeroize::Zeroizing<String>,
    /// Counts the certificates issued: a client made with an older one is made again.
    pub generation: u64,
}

/// The gateway's current client certificate, renewed when it is due.
pub struct ClientCerts {
    gateway: Arc<GatewayIdentity>,
    clock: UnixClock,
    current: Mutex<(ClientCert, u64)>,
}

impl ClientCerts {
    /// A first certificate, issued now.
    pub fn issue(gateway: Arc<GatewayIdentity>, clock: UnixClock) -> Result<Self, String> {
        let now = clock();
        let first = issue(&gateway, 0)?;
        Ok(ClientCerts {
            gateway,
            clock,
            current: Mutex::new((first, now.saturating_add(RENEW_AFTER_MS))),
        })
    }

    /// The generation of the current certificate, after a renewal if one is due. A renewal
    /// that fails keeps the current certificate (still valid for half a year) and is tried
    /// again at the next call.
    pub fn generation(&self) -> u64 {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let now = (self.clock)();
        if now >= current.1 {
            match issue(&self.gateway, current.0.generation + 1) {
                Ok(next) => {
                    tracing::info!(
                        "gateway_client_certificate_renewed generation={}",
                        next.generation
                    );
                    *current = (next, now.saturating_add(RENEW_AFTER_MS));
                }
                Err(e) => tracing::warn!("gateway client certificate not renewed: {e}"),
            }
        }
        current.0.generation
    }

    /// The current certificate and key.
    pub fn current(&self) -> ClientCert {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.0.clone()
    }
}

fn issue(gateway: &GatewayIdentity, generation: u64) -> Result<ClientCert, String> {
    use rustls_pki_types::pem::PemObject;
    let (cert_pem, key_pem) = gateway
        .issue_client_certificate()
        .map_err(|e| e.to_string())?;
    let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| e.to_string())?;
    Ok(ClientCert {
        cert,
        key_pem: zeroize::Zeroizing::new(key_pem),
        generation,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// The certificate is kept for half its year, then a new one (another key, another
    /// certificate) is issued once, and kept again.
    #[test]
    fn a_certificate_is_renewed_at_half_its_life() {
        let dir = tempfile::tempdir().unwrap();
        let gateway = Arc::new(GatewayIdentity::load_or_create(dir.path(), "gw_t").unwrap());
        let now = Arc::new(AtomicU64::new(1_000));
        let clock: UnixClock = {
            let now = now.clone();
            Arc::new(move || now.load(Ordering::SeqCst))
        };
        let certs = ClientCerts::issue(gateway, clock).unwrap();
        let first = certs.current();
        assert_eq!(certs.generation(), 0);
        now.store(1_000 + RENEW_AFTER_MS - 1, Ordering::SeqCst);
        assert_eq!(certs.generation(), 0);
        assert_eq!(certs.current().cert, first.cert);
        now.store(1_000 + RENEW_AFTER_MS, Ordering::SeqCst);
        assert_eq!(certs.generation(), 1);
        let second = certs.current();
        assert_ne!(second.cert, first.cert);
        assert_ne!(*second.key_pem, *first.key_pem);
        assert_eq!(certs.generation(), 1);
        assert_eq!(certs.current().cert, second.cert);
    }
}
