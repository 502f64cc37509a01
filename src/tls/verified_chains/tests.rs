use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;

use super::*;
use crate::pki::Authority;

/// The real verifier, counting the chains it is asked to verify.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn ClientCertVerifier>,
    chains: AtomicUsize,
}

impl ClientCertVerifier for Counting {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.chains.fetch_add(1, Ordering::SeqCst);
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
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
}

/// Trust in `ca` alone.
fn roots_of(ca: &Authority) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
        .unwrap();
    roots
}

fn verifier_of(ca: &Authority) -> (Arc<RememberingVerifier>, Arc<Counting>) {
    let roots = roots_of(ca);
    let webpki =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crate::tls::provider())
            .build()
            .unwrap();
    let counting = Arc::new(Counting {
        inner: webpki,
        chains: AtomicUsize::new(0),
    });
    (RememberingVerifier::new(counting.clone()), counting)
}

fn at(t: SystemTime) -> UnixTime {
    UnixTime::since_unix_epoch(t.duration_since(SystemTime::UNIX_EPOCH).unwrap())
}

fn verify(v: &RememberingVerifier, der: &CertificateDer<'static>, now: SystemTime) -> bool {
    v.verify_client_cert(der, &[], at(now)).is_ok()
}

#[test]
fn a_verified_chain_is_not_verified_again_and_another_is() {
    let ca = Authority::new("callers");
    let (v, counting) = verifier_of(&ca);
    let (a, b) = (ca.client("gw-a").der, ca.client("gw-b").der);
    let now = SystemTime::now();
    assert!(verify(&v, &a, now));
    assert!(verify(&v, &a, now + Duration::from_secs(1)));
    assert_eq!(counting.chains.load(Ordering::SeqCst), 1);
    // Another certificate (same CA, same name or not) is verified on its own.
    assert!(verify(&v, &b, now));
    assert_eq!(counting.chains.load(Ordering::SeqCst), 2);
    // The same certificate presented with an extra one is another chain.
    assert!(v
        .verify_client_cert(&a, std::slice::from_ref(&b), at(now))
        .is_ok());
    assert_eq!(counting.chains.load(Ordering::SeqCst), 3);
}

#[test]
fn a_chain_that_failed_is_refused_every_time() {
    let (ca, other) = (Authority::new("callers"), Authority::new("someone else"));
    let (v, counting) = verifier_of(&ca);
    let stranger = other.client("gw-a").der;
    let now = SystemTime::now();
    for _ in 0..3 {
        assert!(!verify(&v, &stranger, now));
    }
    assert_eq!(counting.chains.load(Ordering::SeqCst), 3);
}

#[test]
fn a_chain_is_verified_again_when_a_certificate_expires_or_the_time_is_up() {
    let ca = Authority::new("callers");
    let (v, counting) = verifier_of(&ca);
    let now = SystemTime::now();
    let expires = now + Duration::from_secs(100);
    let short = ca
        .client_valid("gw-a", now - Duration::from_secs(60), expires)
        .der;
    assert!(verify(&v, &short, now));
    assert!(verify(&v, &short, now + Duration::from_secs(50)));
    assert_eq!(counting.chains.load(Ordering::SeqCst), 1);
    // Past its expiry the chain is verified again, and fails.
    assert!(!verify(&v, &short, expires + Duration::from_secs(1)));
    assert_eq!(counting.chains.load(Ordering::SeqCst), 2);

    let long = ca.client("gw-b").der;
    assert!(verify(&v, &long, now));
    assert!(verify(
        &v,
        &long,
        now + Duration::from_secs(REMEMBER_FOR - 1)
    ));
    assert_eq!(counting.chains.load(Ordering::SeqCst), 3);
    assert!(verify(&v, &long, now + Duration::from_secs(REMEMBER_FOR)));
    assert_eq!(counting.chains.load(Ordering::SeqCst), 4);
    // A clock that went back does not use what was verified later.
    assert!(verify(
        &v,
        &long,
        now + Duration::from_secs(REMEMBER_FOR - 10)
    ));
    assert_eq!(counting.chains.load(Ordering::SeqCst), 5);
}

fn key(tag: u8, n: u64) -> [u8; 32] {
    let mut key = [tag; 32];
    key[..8].copy_from_slice(&n.to_be_bytes());
    key
}

#[test]
fn the_remembered_chains_are_bounded_and_expired_ones_go_first() {
    let chains = VerifiedChains::default();
    let len = || chains.chains.lock().unwrap().len();
    for n in 0..(CAPACITY as u64 - 1) {
        chains.remember(key(0, n), 1_000, 2_000);
    }
    let live = key(1, 0);
    chains.remember(live, 1_000, 10_000);
    assert_eq!(len(), CAPACITY);
    // Full: the expired chains make room; the live one stays.
    chains.remember(key(2, 0), 3_000, 10_000);
    assert_eq!(len(), 2);
    assert!(chains.knows(&live, 3_500));
    assert!(!chains.knows(&key(0, 0), 1_500));
    // Full of live chains: one of them goes for the new one.
    for n in 1..(CAPACITY as u64 - 1) {
        chains.remember(key(2, n), 3_000, 10_000);
    }
    assert_eq!(len(), CAPACITY);
    chains.remember(key(3, 0), 3_000, 10_000);
    assert_eq!(len(), CAPACITY);
    assert!(chains.knows(&key(3, 0), 3_500));
}

/// A client presenting `cert` and signing the handshake with `key` (which may not be the
/// certificate's).
#[derive(Debug)]
struct Presents(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Presents {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

fn client_config(
    ca: &Authority,
    cert: &crate::pki::Issued,
    key_pem: &str,
) -> Arc<rustls::ClientConfig> {
    let roots = roots_of(ca);
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).unwrap();
    let certified = rustls::sign::CertifiedKey::new(vec![cert.der.clone()], signing);
    let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(Presents(Arc::new(certified))));
    Arc::new(config)
}

/// One connection over an in-memory pipe: the handshake, then a byte from the server (which
/// carries any session ticket to the client). The handshake's kind, or the server's error.
async fn connect(
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
) -> Result<rustls::HandshakeKind, std::io::Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (a, b) = tokio::io::duplex(64 * 1024);
    let serve = async move {
        let mut tls = tokio_rustls::TlsAcceptor::from(server).accept(a).await?;
        let kind = tls.get_ref().1.handshake_kind().expect("handshake done");
        tls.write_all(b"x").await?;
        tls.flush().await?;
        Ok::<_, std::io::Error>((kind, tls))
    };
    let call = async move {
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client)
            .connect(name, b)
            .await?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await?;
        Ok::<_, std::io::Error>(tls)
    };
    let (served, called) = tokio::join!(serve, call);
    let (kind, _server_end) = served?;
    called?;
    Ok(kind)
}

fn server_of(ca: &Authority) -> Arc<rustls::ServerConfig> {
    let server = ca.server(&["localhost"]);
    let certs = vec![server.der.clone()];
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let cas = vec![CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap()];
    crate::tls::server_config(certs, key, Some(cas), false).unwrap()
}

#[tokio::test]
async fn a_remembered_chain_still_needs_its_key_and_no_session_is_resumed() {
    let ca = Authority::new("callers");
    let server = server_of(&ca);
    let (gw, other) = (ca.client("gw-a"), ca.client("gw-b"));
    let honest = client_config(&ca, &gw, &gw.key_pem);
    // The chain verified and is remembered; a second connection of the same client is a full
    // handshake again (no ticket was offered to resume).
    assert_eq!(
        connect(server.clone(), honest.clone()).await.unwrap(),
        rustls::HandshakeKind::Full
    );
    assert_eq!(
        connect(server.clone(), honest).await.unwrap(),
        rustls::HandshakeKind::Full
    );
    // The same, remembered certificate with another key is refused.
    let thief = client_config(&ca, &gw, &other.key_pem);
    let err = connect(server.clone(), thief).await.unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("signature"),
        "{err}"
    );
    // And the honest client still gets in.
    let honest = client_config(&ca, &gw, &gw.key_pem);
    assert!(connect(server, honest).await.is_ok());
}

#[test]
fn whether_a_certificate_is_asked_for_and_required_is_the_inner_verifiers() {
    let ca = Authority::new("callers");
    let roots = || Arc::new(roots_of(&ca));
    let required = WebPkiClientVerifier::builder_with_provider(roots(), crate::tls::provider())
        .build()
        .unwrap();
    let optional = WebPkiClientVerifier::builder_with_provider(roots(), crate::tls::provider())
        .allow_unauthenticated()
        .build()
        .unwrap();
    let required = RememberingVerifier::new(required);
    let optional = RememberingVerifier::new(optional);
    assert!(required.offer_client_auth() && required.client_auth_mandatory());
    assert!(optional.offer_client_auth() && !optional.client_auth_mandatory());
    assert!(!required.root_hint_subjects().is_empty());
}
