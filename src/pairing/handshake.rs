//! The pairing handshake, phases 1 to 7, as two state machines without I/O: the tool-host
//! side ([`RemoteHandshake`]) and the gateway side ([`GatewayHandshake`]). Each takes the
//! text of one received message and returns the texts to send, so the same code runs over a
//! WebSocket, in tests against the crabstack transcript, or against each other in memory.
//!
//! Every failure is a [`HandshakeError`]; a side that fails stops (the transport closes, the
//! tool host may first send `pair.error`). Nothing is installed or recorded before the last
//! check of its phase passed.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, Issuer,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};
use zeroize::Zeroizing;

use carapace_filters::nonce::{NonceError, NonceStore};

use super::identity::{GatewayIdentity, HostIdentity};
use super::wire::{
    decode_message, fingerprint_der, fingerprints_match, new_challenge_id, new_challenge_plaintext,
    new_nonce, new_pairing_id, open_challenge, seal_challenge, GoTime, PairChallenge,
    PairChallengeResponse, PairComplete, PairCsrInstalled, PairCsrIssued, PairCsrRequest,
    PairError, PairGatewayInfo, PairIdentity, PairInit, PairMessage, PairRemoteInfo, SignedMessage,
    WireError, WireMessage, STATUS_OK,
};

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

// ------------------------------------------------------------------------------------------
// Tool-host side.

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
    config: RemoteConfig,
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

fn other_type(m: &PairMessage) -> &'static str {
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

// ------------------------------------------------------------------------------------------
// Gateway side.

/// What the operator asked to pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairRequest {
    /// `tool_host`, `subscriber`, `operator`, `listener`.
    pub component_type: String,
    pub component_id: String,
    pub endpoint: String,
}

/// The peer the gateway records when the handshake completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairedPeer {
    pub pairing_id: String,
    pub component_type: String,
    pub component_id: String,
    pub endpoint: String,
    pub public_key_ed25519: String,
    pub public_key_x25519: String,
    /// Fingerprint of the certificate the gateway issued (what the peer presents on mTLS).
    pub mtls_cert_fingerprint: String,
    /// RFC 3339 end of validity of that certificate.
    pub mtls_cert_not_after: String,
    pub paired_at: String,
}

enum GatewayState {
    AwaitIdentity,
    AwaitResponse,
    AwaitCsr,
    AwaitInstalled,
    Done,
}

/// The gateway side of one pairing.
pub struct GatewayHandshake {
    identity: Arc<GatewayIdentity>,
    request: PairRequest,
    /// Over `wss://`: the fingerprint of the TLS certificate the pairing endpoint presented.
    endpoint_tls_fingerprint: Option<String>,
    pairing_id: String,
    remote: Option<PairRemoteInfo>,
    challenge_id: String,
    challenge_plaintext: String,
    issued_fingerprint: String,
    /// `not_after` of the certificate issued, RFC 3339.
    issued_not_after: String,
    state: GatewayState,
}

impl GatewayHandshake {
    /// Start a pairing: returns the handshake and the `pair.init` to send.
    pub fn start(
        identity: Arc<GatewayIdentity>,
        request: PairRequest,
        endpoint_tls_fingerprint: Option<String>,
        now: SystemTime,
    ) -> Result<(Self, String), HandshakeError> {
        // A peer may not pass for the gateway itself, nor for carapace's own principals.
        if request.component_id == identity.gateway_id
            || crate::peers::RESERVED_IDS.contains(&request.component_id.as_str())
            || http::HeaderValue::from_str(&request.component_id).is_err()
        {
            return Err(violation(format!(
                "component_id `{}` is reserved or not a valid name",
                request.component_id
            )));
        }
        let pairing_id = new_pairing_id();
        let mut init = PairInit::new(
            &pairing_id,
            PairGatewayInfo {
                gateway_id: identity.gateway_id.clone(),
                public_key_ed25519: identity.public_key_ed25519(),
                nonce: new_nonce(),
                issued_at: go_time(now)?,
            },
        );
        init.sign_with(&identity.signing_key())?;
        let text = wire(&init)?;
        Ok((
            GatewayHandshake {
                identity,
                request,
                endpoint_tls_fingerprint,
                pairing_id,
                remote: None,
                challenge_id: String::new(),
                challenge_plaintext: String::new(),
                issued_fingerprint: String::new(),
                issued_not_after: String::new(),
                state: GatewayState::AwaitIdentity,
            },
            text,
        ))
    }

    /// Take one received message.
    pub fn on_message(
        &mut self,
        text: &str,
        now: SystemTime,
    ) -> Result<Progress<PairedPeer>, HandshakeError> {
        let msg = decode_message(text)?;
        if let PairMessage::Error(e) = &msg {
            return Err(HandshakeError::Remote {
                code: sanitized(&e.code),
                message: sanitized(&e.message),
            });
        }
        match (std::mem::replace(&mut self.state, GatewayState::Done), msg) {
            (GatewayState::AwaitIdentity, PairMessage::Identity(m)) => self.on_identity(m),
            (GatewayState::AwaitResponse, PairMessage::ChallengeResponse(m)) => {
                same_pairing(&self.pairing_id, &m.pairing_id)?;
                m.verify_with(&self.remote_key())?;
                if m.challenge_id != self.challenge_id
                    || m.challenge_plaintext != self.challenge_plaintext
                {
                    return Err(HandshakeError::ChallengeMismatch);
                }
                self.state = GatewayState::AwaitCsr;
                Ok(Progress::Continue(Vec::new()))
            }
            (GatewayState::AwaitCsr, PairMessage::CsrRequest(m)) => self.on_csr(m, now),
            (GatewayState::AwaitInstalled, PairMessage::CsrInstalled(m)) => {
                same_pairing(&self.pairing_id, &m.pairing_id)?;
                m.verify_with(&self.remote_key())?;
                if !fingerprints_match(&m.mtls_cert_fingerprint, &self.issued_fingerprint) {
                    return Err(HandshakeError::FingerprintMismatch);
                }
                let remote = self.remote.take().expect("set at identity");
                let peer = PairedPeer {
                    pairing_id: self.pairing_id.clone(),
                    component_type: remote.component_type,
                    component_id: remote.component_id,
                    endpoint: self.request.endpoint.clone(),
                    public_key_ed25519: remote.public_key_ed25519,
                    public_key_x25519: remote.public_key_x25519,
                    // The fingerprint of what was issued (equal, up to case, to what the
                    // remote confirmed), in its canonical form.
                    mtls_cert_fingerprint: self.issued_fingerprint.clone(),
                    mtls_cert_not_after: self.issued_not_after.clone(),
                    paired_at: go_time(now)?,
                };
                let complete = PairComplete::ok(&self.pairing_id);
                Ok(Progress::Done(vec![wire(&complete)?], peer))
            }
            (_, other) => Err(violation(format!(
                "unexpected {} at this step",
                other_type(&other)
            ))),
        }
    }

    /// A handshake resumed at the step a recorded transcript reached (tests against the
    /// crabstack vectors, whose messages are bound to that transcript's state).
    #[cfg(test)]
    fn resumed(
        identity: Arc<GatewayIdentity>,
        request: PairRequest,
        transcript: &serde_json::Value,
        step: &str,
    ) -> Self {
        let msg = |i: usize| transcript["messages"][i]["wire_text"].as_str().unwrap();
        let PairMessage::Identity(id) = decode_message(msg(1)).unwrap() else {
            unreachable!()
        };
        let PairMessage::ChallengeResponse(resp) = decode_message(msg(3)).unwrap() else {
            unreachable!()
        };
        let PairMessage::CsrIssued(issued) = decode_message(msg(5)).unwrap() else {
            unreachable!()
        };
        GatewayHandshake {
            identity,
            request,
            endpoint_tls_fingerprint: None,
            pairing_id: id.pairing_id.clone(),
            remote: Some(id.remote),
            challenge_id: resp.challenge_id,
            challenge_plaintext: resp.challenge_plaintext,
            issued_fingerprint: issued.mtls_cert_fingerprint,
            issued_not_after: issued.not_after,
            state: match step {
                "response" => GatewayState::AwaitResponse,
                "csr" => GatewayState::AwaitCsr,
                "installed" => GatewayState::AwaitInstalled,
                other => panic!("no step {other}"),
            },
        }
    }

    fn remote_key(&self) -> String {
        self.remote
            .as_ref()
            .map(|r| r.public_key_ed25519.clone())
            .unwrap_or_default()
    }

    fn on_identity(&mut self, m: PairIdentity) -> Result<Progress<PairedPeer>, HandshakeError> {
        same_pairing(&self.pairing_id, &m.pairing_id)?;
        m.verify_self_signed()?;
        if m.remote.component_type != self.request.component_type {
            return Err(violation(format!(
                "remote is a {}, not a {}",
                sanitized(&m.remote.component_type),
                self.request.component_type
            )));
        }
        if m.remote.component_id.is_empty() || m.remote.component_id != self.request.component_id {
            return Err(violation(format!(
                "remote is `{}`, not `{}`",
                sanitized(&m.remote.component_id),
                self.request.component_id
            )));
        }
        if let Some(seen) = &self.endpoint_tls_fingerprint {
            if m.remote.mtls_cert_fingerprint.is_empty()
                || !fingerprints_match(&m.remote.mtls_cert_fingerprint, seen)
            {
                return Err(HandshakeError::FingerprintMismatch);
            }
        }
        self.challenge_id = new_challenge_id();
        self.challenge_plaintext = new_challenge_plaintext();
        let (ciphertext, aad) = seal_challenge(
            &m.remote.public_key_x25519,
            &self.pairing_id,
            &self.challenge_id,
            self.challenge_plaintext.as_bytes(),
        )?;
        self.remote = Some(m.remote);
        let challenge = PairChallenge::new(&self.pairing_id, &self.challenge_id, ciphertext, aad);
        self.state = GatewayState::AwaitResponse;
        Ok(Progress::Continue(vec![wire(&challenge)?]))
    }

    fn on_csr(
        &mut self,
        m: PairCsrRequest,
        now: SystemTime,
    ) -> Result<Progress<PairedPeer>, HandshakeError> {
        same_pairing(&self.pairing_id, &m.pairing_id)?;
        m.verify_with(&self.remote_key())?;
        // Parsing verifies the CSR's own signature.
        let csr = CertificateSigningRequestParams::from_pem(&m.csr_pem)
            .map_err(|e| HandshakeError::Certificate(format!("CSR: {e}")))?;
        let cn = csr
            .params
            .distinguished_name
            .get(&DnType::CommonName)
            .and_then(dn_text);
        if cn.as_deref() != Some(self.request.component_id.as_str()) {
            return Err(HandshakeError::Certificate(format!(
                "CSR is for {:?}, not {}",
                cn.as_deref().map(sanitized),
                self.request.component_id
            )));
        }
        let issued = issue(&self.identity, csr, now)?;
        self.issued_fingerprint = issued.mtls_cert_fingerprint.clone();
        self.issued_not_after = issued.not_after.clone();
        let mut msg = PairCsrIssued::new(
            &self.pairing_id,
            issued.certificate_pem,
            vec![self.identity.ca_cert_pem.clone()],
            issued.serial_hex,
            &issued.mtls_cert_fingerprint,
            issued.not_before,
            issued.not_after,
        );
        msg.sign_with(&self.identity.signing_key())?;
        self.state = GatewayState::AwaitInstalled;
        Ok(Progress::Continue(vec![wire(&msg)?]))
    }
}

fn dn_text(v: &rcgen::DnValue) -> Option<String> {
    match v {
        rcgen::DnValue::Utf8String(s) => Some(s.clone()),
        rcgen::DnValue::PrintableString(s) => Some(s.as_str().to_string()),
        rcgen::DnValue::Ia5String(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

struct IssuedCert {
    certificate_pem: String,
    serial_hex: String,
    mtls_cert_fingerprint: String,
    not_before: String,
    not_after: String,
}

/// Issue the mTLS certificate for a verified CSR: the CSR's subject and names, client and
/// server use, a random serial, whole-second validity from a little before now for a year.
fn issue(
    identity: &GatewayIdentity,
    csr: CertificateSigningRequestParams,
    now: SystemTime,
) -> Result<IssuedCert, HandshakeError> {
    let cert_err = |e: rcgen::Error| HandshakeError::Certificate(e.to_string());
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    let (not_before, not_after) = (whole - BACKDATE, whole + CERTIFICATE_LIFETIME);
    let mut serial = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut serial);
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    let mut csr = csr;
    let params = &mut csr.params;
    // Only DNS names and addresses from the CSR: never a URI name (that marks the gateway's
    // own certificate, see `tls::GATEWAY_URI_PREFIX`), nor anything else.
    params
        .subject_alt_names
        .retain(|n| matches!(n, rcgen::SanType::DnsName(_) | rcgen::SanType::IpAddress(_)));
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.not_before = not_before.into();
    params.not_after = not_after.into();
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ClientAuth,
        ExtendedKeyUsagePurpose::ServerAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let issuer =
        Issuer::from_ca_cert_pem(&identity.ca_cert_pem, identity.ca_key()).map_err(cert_err)?;
    let cert = csr.signed_by(&issuer).map_err(cert_err)?;
    Ok(IssuedCert {
        certificate_pem: cert.pem(),
        serial_hex: hex::encode(serial).trim_start_matches('0').to_string(),
        mtls_cert_fingerprint: fingerprint_der(cert.der()),
        not_before: go_time(not_before)?,
        not_after: go_time(not_after)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use carapace_filters::nonce::NonceStoreConfig;
    use serde_json::Value;

    fn vectors(name: &str) -> Value {
        let path = format!(
            "{}/../shared/vectors/crabstack/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    fn nonces() -> Arc<NonceStore> {
        Arc::new(
            NonceStore::open(
                NonceStoreConfig {
                    capacity: 64,
                    ttl: Duration::from_secs(600),
                    journal: None,
                },
                0,
            )
            .unwrap(),
        )
    }

    fn hex32(v: &Value) -> [u8; 32] {
        hex::decode(v.as_str().unwrap())
            .unwrap()
            .try_into()
            .unwrap()
    }

    fn transcript_clock(t: &Value) -> SystemTime {
        GoTime::parse_rfc3339(t["generator"]["fixed_clock"].as_str().unwrap())
            .unwrap()
            .to_system_time()
            .unwrap()
    }

    fn remote_for_transcript(t: &Value, store: Arc<NonceStore>) -> RemoteHandshake {
        let k = &t["keys"];
        let host = HostIdentity::from_keys(
            hex32(&k["remote_ed25519"]["seed_hex"]),
            hex32(&k["remote_x25519"]["private_key_hex"]),
        );
        let csr_key =
            p256_sec1_to_keypair(k["remote_csr_key"]["private_key_pem"].as_str().unwrap());
        RemoteHandshake::new(
            RemoteConfig {
                component_type: "tool_host".into(),
                component_id: t["inputs"]["component_id"].as_str().unwrap().into(),
                gateway_public_key_ed25519: k["gateway_ed25519"]["public_key_b64"]
                    .as_str()
                    .unwrap()
                    .into(),
                endpoint_tls_fingerprint: String::new(),
            },
            Arc::new(host),
            store,
        )
        .with_csr_key(csr_key)
    }

    /// Go writes the CSR key as SEC1 (`EC PRIVATE KEY`); ring reads PKCS#8. Rewrap the
    /// P-256 scalar and public point.
    fn p256_sec1_to_keypair(pem: &str) -> KeyPair {
        let der = rustls_pki_types::PrivateSec1KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
        let der = der.secret_sec1_der();
        assert_eq!(&der[..7], [0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20]);
        let (scalar, point) = (&der[7..39], &der[der.len() - 65..]);
        let mut inner = vec![0x30, 0x6b, 0x02, 0x01, 0x01, 0x04, 0x20];
        inner.extend_from_slice(scalar);
        inner.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42, 0x00]);
        inner.extend_from_slice(point);
        let mut pkcs8 = vec![0x30, 0x81, 0x87, 0x02, 0x01, 0x00];
        pkcs8.extend_from_slice(&[
            0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
            0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
        ]);
        pkcs8.extend_from_slice(&[0x04, 0x6d]);
        pkcs8.extend_from_slice(&inner);
        KeyPair::try_from(pkcs8.as_slice()).unwrap()
    }

    #[test]
    fn the_transcript_drives_the_tool_host_side_byte_for_byte() {
        let t = vectors("pairing_transcript.json");
        let wire_of = |i: usize| t["messages"][i]["wire_text"].as_str().unwrap().to_string();
        let now = transcript_clock(&t);
        let mut remote = remote_for_transcript(&t, nonces());

        let Progress::Continue(out) = remote.on_message(&wire_of(0), now).unwrap() else {
            panic!("done too early")
        };
        assert_eq!(out, [wire_of(1)], "pair.identity differs from crabstack's");

        let Progress::Continue(out) = remote.on_message(&wire_of(2), now).unwrap() else {
            panic!("done too early")
        };
        assert_eq!(out[0], wire_of(3), "pair.challenge_response differs");
        // The CSR's ECDSA signature is randomized: check what it says, not its bytes.
        let PairMessage::CsrRequest(csr) = decode_message(&out[1]).unwrap() else {
            panic!("not a CSR request")
        };
        let remote_key = t["keys"]["remote_ed25519"]["public_key_b64"]
            .as_str()
            .unwrap();
        csr.verify_with(remote_key).unwrap();
        let parsed = CertificateSigningRequestParams::from_pem(&csr.csr_pem).unwrap();
        assert_eq!(
            parsed
                .params
                .distinguished_name
                .get(&DnType::CommonName)
                .and_then(dn_text)
                .as_deref(),
            Some("sidecar-vectors")
        );

        let Progress::Continue(out) = remote.on_message(&wire_of(5), now).unwrap() else {
            panic!("done too early")
        };
        assert_eq!(out, [wire_of(6)], "pair.csr_installed differs");

        let Progress::Done(out, installed) = remote.on_message(&wire_of(7), now).unwrap() else {
            panic!("not done after pair.complete")
        };
        assert!(out.is_empty());
        assert_eq!(
            installed.mtls_cert_fingerprint,
            t["remote_result"]["mtls_cert_fingerprint"]
                .as_str()
                .unwrap()
        );
        assert_eq!(installed.gateway_id, "gw-vectors");
    }

    #[test]
    fn pairing_and_peer_ids_have_one_documented_form() {
        assert!(is_valid_pairing_id("a3f3553b6b9b3861a24253b5cb7c43a7"));
        for bad in [
            "",
            "../../x",
            "/etc/x",
            "A3F3553B6B9B3861A24253B5CB7C43A7",
            "a3f3",
        ] {
            assert!(!is_valid_pairing_id(bad), "{bad:?}");
        }
        for good in ["gw_home", "gw-vectors", "gw.1"] {
            assert!(is_valid_peer_id(good), "{good:?}");
        }
        let long = "g".repeat(65);
        for bad in [
            "",
            ".",
            "..",
            "../gw",
            "gw home",
            "gw\n",
            "local",
            "anonymous",
            &long,
        ] {
            assert!(!is_valid_peer_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_tool_host_refuses_bad_initiations() {
        let t = vectors("pairing_transcript.json");
        let init = t["messages"][0]["wire_text"].as_str().unwrap();
        let now = transcript_clock(&t);
        // Another gateway key configured.
        let mut r = remote_for_transcript(&t, nonces());
        r.config.gateway_public_key_ed25519 = super::super::wire::SigningIdentity::generate()
            .0
            .public_key_b64();
        assert!(matches!(
            r.on_message(init, now),
            Err(HandshakeError::Wire(_))
        ));
        // Stale, either way.
        for skew in [121i64, -121] {
            let at = if skew > 0 {
                now + Duration::from_secs(skew as u64)
            } else {
                now - Duration::from_secs((-skew) as u64)
            };
            let mut r = remote_for_transcript(&t, nonces());
            assert!(matches!(
                r.on_message(init, at),
                Err(HandshakeError::StaleInit(_))
            ));
        }
        // Replayed: the nonce store outlives one handshake.
        let store = nonces();
        let mut r = remote_for_transcript(&t, store.clone());
        r.on_message(init, now).unwrap();
        let mut again = remote_for_transcript(&t, store);
        assert!(matches!(
            again.on_message(init, now),
            Err(HandshakeError::ReplayedInit)
        ));
        // A message out of order.
        let mut r = remote_for_transcript(&t, nonces());
        let challenge = t["messages"][2]["wire_text"].as_str().unwrap();
        assert!(matches!(
            r.on_message(challenge, now),
            Err(HandshakeError::Protocol(_))
        ));
    }

    #[test]
    fn handshake_level_negative_vectors_are_refused() {
        let t = vectors("pairing_transcript.json");
        let neg = vectors("pairing_negative.json");
        let now = transcript_clock(&t);
        let find = |id: &str| {
            neg["vectors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["id"] == id)
                .unwrap_or_else(|| panic!("no vector {id}"))["wire_text"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let wire_of = |i: usize| t["messages"][i]["wire_text"].as_str().unwrap().to_string();
        // A certificate swapped for another (re-signed by the gateway): the tool host refuses.
        let mut r = remote_for_transcript(&t, nonces());
        r.on_message(&wire_of(0), now).unwrap();
        r.on_message(&wire_of(2), now).unwrap();
        let err = r
            .on_message(&find("issued.cert_swapped_resigned"), now)
            .unwrap_err();
        assert!(
            matches!(
                err,
                HandshakeError::FingerprintMismatch | HandshakeError::Certificate(_)
            ),
            "{err}"
        );
    }

    #[test]
    fn the_gateway_refuses_the_crabstack_handshake_level_negative_vectors() {
        let t = vectors("pairing_transcript.json");
        let neg = vectors("pairing_negative.json");
        let now = transcript_clock(&t);
        let dir = tempfile::tempdir().unwrap();
        let gw = Arc::new(GatewayIdentity::load_or_create(dir.path(), "gw-vectors").unwrap());
        let request = PairRequest {
            component_type: "tool_host".into(),
            component_id: "sidecar-vectors".into(),
            endpoint: "ws://127.0.0.1:47001/v1/pair".into(),
        };
        let negative = |id: &str| {
            neg["vectors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["id"] == id)
                .unwrap()["wire_text"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let original = |i: usize| t["messages"][i]["wire_text"].as_str().unwrap().to_string();
        let at = |step: &str| GatewayHandshake::resumed(gw.clone(), request.clone(), &t, step);

        // The recorded message passes at that step; the tampered one is refused, and why.
        assert!(at("response").on_message(&original(3), now).is_ok());
        let err = at("response")
            .on_message(&negative("response.wrong_plaintext_resigned"), now)
            .unwrap_err();
        assert!(matches!(err, HandshakeError::ChallengeMismatch), "{err}");

        assert!(at("csr").on_message(&original(4), now).is_ok());
        let err = at("csr")
            .on_message(&negative("csr.self_signature_broken_resigned"), now)
            .unwrap_err();
        assert!(matches!(err, HandshakeError::Certificate(_)), "{err}");

        assert!(matches!(
            at("installed").on_message(&original(6), now),
            Ok(Progress::Done(..))
        ));
        let err = at("installed")
            .on_message(&negative("installed.other_fingerprint_resigned"), now)
            .unwrap_err();
        assert!(matches!(err, HandshakeError::FingerprintMismatch), "{err}");
    }

    /// Run a whole pairing in memory; `tamper` may rewrite each remote-to-gateway message.
    fn pair(
        gw_identity: Arc<GatewayIdentity>,
        request: PairRequest,
        host: Arc<HostIdentity>,
        config: RemoteConfig,
        tls_seen: Option<String>,
        mut tamper: impl FnMut(String) -> String,
    ) -> Result<(PairedPeer, Installed), HandshakeError> {
        let now = SystemTime::now();
        let (mut gw, init) = GatewayHandshake::start(gw_identity, request, tls_seen, now)?;
        let mut remote = RemoteHandshake::new(config, host, nonces());
        let mut to_remote = vec![init];
        let mut installed = None;
        loop {
            let mut to_gateway = Vec::new();
            for m in to_remote.drain(..) {
                match remote.on_message(&m, now)? {
                    Progress::Continue(out) => to_gateway.extend(out),
                    Progress::Done(out, i) => {
                        to_gateway.extend(out);
                        installed = Some(i);
                    }
                }
            }
            if let Some(i) = installed.take() {
                unreachable!("the tool host finished before the gateway: {i:?}");
            }
            for m in to_gateway {
                match gw.on_message(&tamper(m), now)? {
                    Progress::Continue(out) => to_remote.extend(out),
                    Progress::Done(out, peer) => {
                        let mut done = None;
                        for m in out {
                            if let Progress::Done(_, i) = remote.on_message(&m, now)? {
                                done = Some(i);
                            }
                        }
                        return Ok((peer, done.expect("tool host completes")));
                    }
                }
            }
        }
    }

    struct Parties {
        _dir: tempfile::TempDir,
        gw: Arc<GatewayIdentity>,
        host: Arc<HostIdentity>,
    }

    fn parties() -> Parties {
        let dir = tempfile::tempdir().unwrap();
        Parties {
            gw: Arc::new(
                GatewayIdentity::load_or_create(&dir.path().join("gw"), "gw_test").unwrap(),
            ),
            host: Arc::new(HostIdentity::load_or_create(&dir.path().join("host")).unwrap()),
            _dir: dir,
        }
    }

    fn request() -> PairRequest {
        PairRequest {
            component_type: "tool_host".into(),
            component_id: "memory-east".into(),
            endpoint: "ws://127.0.0.1:7444/v1/pair".into(),
        }
    }

    fn config(p: &Parties) -> RemoteConfig {
        RemoteConfig {
            component_type: "tool_host".into(),
            component_id: "memory-east".into(),
            gateway_public_key_ed25519: p.gw.public_key_ed25519(),
            endpoint_tls_fingerprint: String::new(),
        }
    }

    #[test]
    fn a_gateway_and_a_tool_host_pair_and_the_certificate_serves_mtls() {
        let p = parties();
        let (peer, installed) = pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            None,
            |m| m,
        )
        .unwrap();
        assert_eq!(peer.component_id, "memory-east");
        assert_eq!(peer.public_key_ed25519, p.host.public_key_ed25519());
        assert_eq!(peer.mtls_cert_fingerprint, installed.mtls_cert_fingerprint);
        assert_eq!(installed.chain_pem, std::slice::from_ref(&p.gw.ca_cert_pem));
        // The issued certificate and its key make a working TLS server identity.
        let cert = single_cert(&installed.certificate_pem).unwrap();
        assert_eq!(fingerprint_der(&cert), installed.mtls_cert_fingerprint);
        let key =
            rustls_pki_types::PrivateKeyDer::from_pem_slice(installed.key_pem.as_bytes()).unwrap();
        rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
    }

    fn resign<M: SignedMessage + WireMessage>(
        mut m: M,
        key: &super::super::wire::SigningIdentity,
    ) -> String {
        m.sign_with(key).unwrap();
        m.to_wire().unwrap()
    }

    #[test]
    fn the_gateway_refuses_each_bad_phase() {
        let p = parties();
        let host_key = p.host.signing_key();
        let expect = |r: Result<(PairedPeer, Installed), HandshakeError>, what: &str| match r {
            Err(e) => e,
            Ok(_) => panic!("{what}: paired"),
        };

        // Another component than requested.
        let mut other = request();
        other.component_id = "memory-west".into();
        let e = expect(
            pair(p.gw.clone(), other, p.host.clone(), config(&p), None, |m| m),
            "wrong component",
        );
        assert!(matches!(e, HandshakeError::Protocol(_)), "{e}");

        // Over wss://, an identity that does not carry the endpoint's TLS fingerprint.
        let e = expect(
            pair(
                p.gw.clone(),
                request(),
                p.host.clone(),
                config(&p),
                Some("sha256:00".into()),
                |m| m,
            ),
            "tls fingerprint",
        );
        assert!(matches!(e, HandshakeError::FingerprintMismatch), "{e}");

        // A wrong challenge answer, properly signed.
        let e = expect(
            pair(
                p.gw.clone(),
                request(),
                p.host.clone(),
                config(&p),
                None,
                |m| match decode_message(&m).unwrap() {
                    PairMessage::ChallengeResponse(mut r) => {
                        r.challenge_plaintext = "bm90IHRoZSBjaGFsbGVuZ2U=".into();
                        resign(r, &host_key)
                    }
                    _ => m,
                },
            ),
            "wrong answer",
        );
        assert!(matches!(e, HandshakeError::ChallengeMismatch), "{e}");

        // A CSR for another identity, properly signed.
        let e = expect(
            pair(
                p.gw.clone(),
                request(),
                p.host.clone(),
                config(&p),
                None,
                |m| match decode_message(&m).unwrap() {
                    PairMessage::CsrRequest(mut r) => {
                        let key = KeyPair::generate().unwrap();
                        let mut params = CertificateParams::new(vec![]).unwrap();
                        params
                            .distinguished_name
                            .push(DnType::CommonName, "gw_test");
                        r.csr_pem = params.serialize_request(&key).unwrap().pem().unwrap();
                        resign(r, &host_key)
                    }
                    _ => m,
                },
            ),
            "csr identity",
        );
        assert!(matches!(e, HandshakeError::Certificate(_)), "{e}");

        // A CSR whose own signature is broken.
        let e = expect(
            pair(
                p.gw.clone(),
                request(),
                p.host.clone(),
                config(&p),
                None,
                |m| match decode_message(&m).unwrap() {
                    PairMessage::CsrRequest(mut r) => {
                        let mut der =
                            rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(
                                r.csr_pem.as_bytes(),
                            )
                            .unwrap()
                            .as_ref()
                            .to_vec();
                        let last = der.len() - 1;
                        der[last] ^= 1;
                        r.csr_pem = pem_encode("CERTIFICATE REQUEST", &der);
                        resign(r, &host_key)
                    }
                    _ => m,
                },
            ),
            "csr signature",
        );
        assert!(matches!(e, HandshakeError::Certificate(_)), "{e}");

        // An install confirmation for another certificate, properly signed.
        let e = expect(
            pair(
                p.gw.clone(),
                request(),
                p.host.clone(),
                config(&p),
                None,
                |m| match decode_message(&m).unwrap() {
                    PairMessage::CsrInstalled(mut r) => {
                        r.mtls_cert_fingerprint = format!("sha256:{}", "ab".repeat(32));
                        resign(r, &host_key)
                    }
                    _ => m,
                },
            ),
            "installed fingerprint",
        );
        assert!(matches!(e, HandshakeError::FingerprintMismatch), "{e}");

        // A message not signed by the key the remote presented.
        let stranger = super::super::wire::SigningIdentity::generate().0;
        let e = expect(
            pair(
                p.gw.clone(),
                request(),
                p.host.clone(),
                config(&p),
                None,
                |m| match decode_message(&m).unwrap() {
                    PairMessage::CsrRequest(r) => resign(r, &stranger),
                    _ => m,
                },
            ),
            "foreign signature",
        );
        assert!(matches!(e, HandshakeError::Wire(_)), "{e}");

        // The tool host gives up and says why.
        let e = expect(
            pair(
                p.gw.clone(),
                request(),
                p.host.clone(),
                config(&p),
                None,
                |m| match decode_message(&m).unwrap() {
                    PairMessage::CsrRequest(_) => {
                        PairError::handshake_failed("disk full").to_wire().unwrap()
                    }
                    _ => m,
                },
            ),
            "remote error",
        );
        assert!(matches!(e, HandshakeError::Remote { .. }), "{e}");
    }

    fn pem_encode(label: &str, der: &[u8]) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let mut out = format!("-----BEGIN {label}-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(chunk).unwrap());
            out.push('\n');
        }
        out.push_str(&format!("-----END {label}-----\n"));
        out
    }
}
