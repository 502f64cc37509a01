//! The tool-host side of the handshake: answers the gateway's initiation and challenge, sends its CSR and checks the issued certificate.

use std::sync::Arc;
use std::time::SystemTime;

use carapace_filters::nonce::{NonceError, NonceStore};
use rcgen::{CertificateParams, DnType, KeyPair};
use rustls_pki_types::{CertificateDer, UnixTime};
use zeroize::Zeroizing;

use super::{
    is_valid_pairing_id, is_valid_peer_id, same_pairing, sanitized, single_cert, unix_ms,
    violation, wire, HandshakeError, MAX_INIT_SKEW,
};
use crate::pairing::identity::HostIdentity;
use crate::pairing::wire::{
    decode_message, fingerprint_der, fingerprints_match, open_challenge, GoTime, PairChallenge,
    PairChallengeResponse, PairCsrInstalled, PairCsrIssued, PairCsrRequest, PairError,
    PairIdentity, PairInit, PairMessage, PairRemoteInfo, SignedMessage, WireMessage, STATUS_OK,
};

/// What the tool host is and whom it trusts.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// `tool_host` for a carapace in front of a tool host.
    pub component_type: String,
    pub component_id: String,
    /// The gateway key from configuration: only a `pair.init` it signed is answered.
    pub gateway_public_key_ed25519: String,
    /// Over `wss://`: the fingerprint of the pairing endpoint's TLS certificate; `""` over
    /// loopback `ws://`.
    pub endpoint_tls_fingerprint: String,
}

/// What the tool host installs when the handshake completes.
pub struct Installed {
    pub gateway_id: String,
    pub gateway_public_key_ed25519: String,
    pub certificate_pem: String,
    /// The private key of the certificate (PKCS#8 PEM).
    pub key_pem: Zeroizing<String>,
    /// The CA chain the gateway sent: client certificates must chain to it.
    pub chain_pem: Vec<String>,
    pub mtls_cert_fingerprint: String,
    pub pairing_id: String,
}

impl std::fmt::Debug for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Installed")
            .field("gateway_id", &self.gateway_id)
            .field("mtls_cert_fingerprint", &self.mtls_cert_fingerprint)
            .finish_non_exhaustive()
    }
}

enum RemoteState {
    AwaitInit,
    AwaitChallenge,
    AwaitIssued,
    AwaitComplete(Box<Installed>),
    Done,
}

/// The tool-host side of one pairing.
pub struct RemoteHandshake {
    pub(super) config: RemoteConfig,
    identity: Arc<HostIdentity>,
    init_nonces: Arc<NonceStore>,
    csr_key: Option<KeyPair>,
    pairing_id: String,
    gateway_id: String,
    state: RemoteState,
}

/// Where a handshake stands after a message.
#[derive(Debug)]
pub enum Progress<T> {
    /// Send these messages and wait for the next one.
    Continue(Vec<String>),
    /// Send these messages; the handshake is complete.
    Done(Vec<String>, T),
}

impl RemoteHandshake {
    /// A handshake waiting for `pair.init`. `init_nonces` remembers `pair.init` nonces so a
    /// captured initiation cannot be replayed (it outlives single handshakes).
    pub fn new(
        config: RemoteConfig,
        identity: Arc<HostIdentity>,
        init_nonces: Arc<NonceStore>,
    ) -> Self {
        RemoteHandshake {
            config,
            identity,
            init_nonces,
            csr_key: None,
            pairing_id: String::new(),
            gateway_id: String::new(),
            state: RemoteState::AwaitInit,
        }
    }

    /// Use this key for the CSR instead of a fresh one (tests against recorded transcripts).
    pub fn with_csr_key(mut self, key: KeyPair) -> Self {
        self.csr_key = Some(key);
        self
    }

    /// The certificate to install, once `pair.csr_issued` passed every check and until
    /// `pair.complete` (install it before sending the confirmation).
    pub fn installed(&self) -> Option<&Installed> {
        match &self.state {
            RemoteState::AwaitComplete(i) => Some(i),
            _ => None,
        }
    }

    /// The `pair.error` to send when the handshake fails (the gateway never sends one).
    pub fn error_message(&self, e: &HandshakeError) -> String {
        PairError::handshake_failed(e.to_string())
            .to_wire()
            .unwrap_or_default()
    }

    /// Take one received message.
    pub fn on_message(
        &mut self,
        text: &str,
        now: SystemTime,
    ) -> Result<Progress<Installed>, HandshakeError> {
        let msg = decode_message(text)?;
        if let PairMessage::Error(e) = &msg {
            return Err(HandshakeError::Remote {
                code: sanitized(&e.code),
                message: sanitized(&e.message),
            });
        }
        match (std::mem::replace(&mut self.state, RemoteState::Done), msg) {
            (RemoteState::AwaitInit, PairMessage::Init(init)) => self.on_init(init, now),
            (RemoteState::AwaitChallenge, PairMessage::Challenge(ch)) => self.on_challenge(ch),
            (RemoteState::AwaitIssued, PairMessage::CsrIssued(issued)) => {
                self.on_issued(issued, now)
            }
            (RemoteState::AwaitComplete(installed), PairMessage::Complete(c)) => {
                same_pairing(&self.pairing_id, &c.pairing_id)?;
                if c.status != STATUS_OK {
                    return Err(violation(format!(
                        "pair.complete status {}",
                        sanitized(&c.status)
                    )));
                }
                Ok(Progress::Done(Vec::new(), *installed))
            }
            (_, other) => Err(violation(format!(
                "unexpected {} at this step",
                other_type(&other)
            ))),
        }
    }

    fn on_init(
        &mut self,
        init: PairInit,
        now: SystemTime,
    ) -> Result<Progress<Installed>, HandshakeError> {
        // Signature first: nothing about an unverified initiation is remembered.
        init.verify_from_gateway(&self.config.gateway_public_key_ed25519)?;
        // The pairing id names a directory and the gateway id a peer record: refuse anything
        // else than their documented forms before either is used.
        if !is_valid_pairing_id(&init.pairing_id) {
            return Err(violation(format!(
                "pairing_id {:?} is not 32 lowercase hex characters",
                sanitized(&init.pairing_id)
            )));
        }
        if !is_valid_peer_id(&init.gateway.gateway_id) {
            return Err(violation(format!(
                "gateway_id {:?} is not a valid peer id",
                sanitized(&init.gateway.gateway_id)
            )));
        }
        let issued = GoTime::parse_rfc3339(&init.gateway.issued_at)
            .and_then(|t| t.to_system_time())
            .ok_or_else(|| HandshakeError::StaleInit(init.gateway.issued_at.clone()))?;
        let skew = match now.duration_since(issued) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        if skew > MAX_INIT_SKEW {
            return Err(HandshakeError::StaleInit(init.gateway.issued_at.clone()));
        }
        match self
            .init_nonces
            .check_and_insert("pair.init", &init.gateway.nonce, unix_ms(now))
        {
            Ok(()) => {}
            Err(NonceError::Replay) => return Err(HandshakeError::ReplayedInit),
            Err(e) => return Err(HandshakeError::Store(e.to_string())),
        }
        self.pairing_id = init.pairing_id.clone();
        self.gateway_id = init.gateway.gateway_id.clone();
        let mut identity = PairIdentity::new(
            &self.pairing_id,
            PairRemoteInfo {
                component_type: self.config.component_type.clone(),
                component_id: self.config.component_id.clone(),
                public_key_ed25519: self.identity.public_key_ed25519(),
                public_key_x25519: self.identity.public_key_x25519(),
                mtls_cert_fingerprint: self.config.endpoint_tls_fingerprint.clone(),
            },
        );
        identity.sign_with(&self.identity.signing_key())?;
        self.state = RemoteState::AwaitChallenge;
        Ok(Progress::Continue(vec![wire(&identity)?]))
    }

    fn on_challenge(&mut self, ch: PairChallenge) -> Result<Progress<Installed>, HandshakeError> {
        same_pairing(&self.pairing_id, &ch.pairing_id)?;
        let plaintext = open_challenge(&self.identity.x25519_secret(), &ch)?;
        let plaintext = String::from_utf8(plaintext)
            .map_err(|_| violation("challenge plaintext is not text"))?;
        let signer = self.identity.signing_key();
        let mut response =
            PairChallengeResponse::new(&self.pairing_id, &ch.challenge_id, plaintext);
        response.sign_with(&signer)?;
        // A fresh TLS key for the certificate the gateway will issue.
        let key = match self.csr_key.take() {
            Some(k) => k,
            None => KeyPair::generate().map_err(|e| HandshakeError::Certificate(e.to_string()))?,
        };
        // The gateway pins this certificate by fingerprint; the names serve local clients.
        let names = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        let mut params = CertificateParams::new(names)
            .map_err(|e| HandshakeError::Certificate(e.to_string()))?;
        params
            .distinguished_name
            .push(DnType::CommonName, self.config.component_id.clone());
        let csr = params
            .serialize_request(&key)
            .and_then(|c| c.pem())
            .map_err(|e| HandshakeError::Certificate(e.to_string()))?;
        self.csr_key = Some(key);
        let mut request = PairCsrRequest::new(&self.pairing_id, csr);
        request.sign_with(&signer)?;
        self.state = RemoteState::AwaitIssued;
        Ok(Progress::Continue(vec![wire(&response)?, wire(&request)?]))
    }

    fn on_issued(
        &mut self,
        issued: PairCsrIssued,
        now: SystemTime,
    ) -> Result<Progress<Installed>, HandshakeError> {
        same_pairing(&self.pairing_id, &issued.pairing_id)?;
        issued.verify_with(&self.config.gateway_public_key_ed25519)?;
        let leaf = single_cert(&issued.certificate_pem)?;
        let fingerprint = fingerprint_der(&leaf);
        if !fingerprints_match(&fingerprint, &issued.mtls_cert_fingerprint) {
            return Err(HandshakeError::FingerprintMismatch);
        }
        let key = self.csr_key.take().expect("set when the CSR was sent");
        check_issued(&leaf, &key, &issued.certificate_chain_pem, now)?;
        let installed = Installed {
            gateway_id: self.gateway_id.clone(),
            gateway_public_key_ed25519: self.config.gateway_public_key_ed25519.clone(),
            certificate_pem: issued.certificate_pem.clone(),
            key_pem: Zeroizing::new(key.serialize_pem()),
            chain_pem: issued.certificate_chain_pem.clone(),
            // Computed, not the gateway's text: it is logged and stored.
            mtls_cert_fingerprint: fingerprint,
            pairing_id: self.pairing_id.clone(),
        };
        let mut confirm = PairCsrInstalled::new(&self.pairing_id, &issued.mtls_cert_fingerprint);
        confirm.sign_with(&self.identity.signing_key())?;
        self.state = RemoteState::AwaitComplete(Box::new(installed));
        Ok(Progress::Continue(vec![wire(&confirm)?]))
    }
}

pub(super) fn other_type(m: &PairMessage) -> &'static str {
    match m {
        PairMessage::Init(_) => "pair.init",
        PairMessage::Identity(_) => "pair.identity",
        PairMessage::Challenge(_) => "pair.challenge",
        PairMessage::ChallengeResponse(_) => "pair.challenge_response",
        PairMessage::CsrRequest(_) => "pair.csr_request",
        PairMessage::CsrIssued(_) => "pair.csr_issued",
        PairMessage::CsrInstalled(_) => "pair.csr_installed",
        PairMessage::Complete(_) => "pair.complete",
        PairMessage::Error(_) => "pair.error",
    }
}

/// The issued certificate is for our key, chains to the CA the gateway sent, and is valid
/// now for client and server use.
fn check_issued(
    leaf: &CertificateDer<'static>,
    key: &KeyPair,
    chain_pem: &[String],
    now: SystemTime,
) -> Result<(), HandshakeError> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(leaf)
        .map_err(|e| HandshakeError::Certificate(e.to_string()))?;
    if cert.tbs_certificate.subject_pki.raw
        != rcgen::PublicKeyData::subject_public_key_info(key).as_slice()
    {
        return Err(HandshakeError::Certificate(
            "issued for another key than the CSR's".into(),
        ));
    }
    if chain_pem.is_empty() {
        return Err(HandshakeError::Certificate("no CA chain was sent".into()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for pem in chain_pem {
        roots
            .add(single_cert(pem)?)
            .map_err(|e| HandshakeError::Certificate(e.to_string()))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        crate::tls::provider(),
    )
    .build()
    .map_err(|e| HandshakeError::Certificate(e.to_string()))?;
    let at = UnixTime::since_unix_epoch(
        now.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    verifier
        .verify_client_cert(leaf, &[], at)
        .map_err(|e| HandshakeError::Certificate(e.to_string()))?;
    Ok(())
}
