//! The gateway side of the handshake: initiates, challenges, and issues the tool host's certificate from its CSR.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyUsagePurpose,
    SerialNumber,
};

use super::remote::{other_type, Progress};
use super::{
    go_time, same_pairing, sanitized, violation, wire, HandshakeError, BACKDATE,
    CERTIFICATE_LIFETIME,
};
use crate::pairing::identity::GatewayIdentity;
use crate::pairing::wire::{
    decode_message, fingerprint_der, fingerprints_match, new_challenge_id, new_challenge_plaintext,
    new_nonce, new_pairing_id, seal_challenge, PairChallenge, PairComplete, PairCsrIssued,
    PairCsrRequest, PairGatewayInfo, PairIdentity, PairInit, PairMessage, PairRemoteInfo,
    SignedMessage,
};

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
    pub(super) fn resumed(
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

pub(super) fn dn_text(v: &rcgen::DnValue) -> Option<String> {
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
