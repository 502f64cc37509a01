//! Constructors and the Go-field-order encoding of each message (signed payload and wire form).

use super::error::WireError;
use super::go_json::JsonObject;
use super::go_time::{signed_time, signed_time_utc};
use super::messages::{
    PairChallenge, PairChallengeResponse, PairComplete, PairCsrInstalled, PairCsrIssued,
    PairCsrRequest, PairError, PairGatewayInfo, PairIdentity, PairInit, PairRemoteInfo,
    SignedMessage, WireMessage,
};
use super::signing::decode_key32;
use super::{
    ERROR_CODE_HANDSHAKE_FAILED, PROTOCOL_VERSION, STATUS_OK, TYPE_CHALLENGE,
    TYPE_CHALLENGE_RESPONSE, TYPE_COMPLETE, TYPE_CSR_INSTALLED, TYPE_CSR_ISSUED, TYPE_CSR_REQUEST,
    TYPE_ERROR, TYPE_IDENTITY, TYPE_INIT,
};

// Each `encode(signed)` writes the Go struct in declaration order: with `signed` the
// signed payload (no `sig_ed25519`), otherwise the wire struct (`sig_ed25519` last).

impl PairInit {
    /// A `pair.init` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, gateway: PairGatewayInfo) -> Self {
        Self {
            msg_type: TYPE_INIT.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            gateway,
            sig_ed25519: String::new(),
        }
    }

    /// What a remote does with `pair.init`: the carried gateway key must be the
    /// configured one, and the signature must verify with the configured key.
    pub fn verify_from_gateway(&self, configured_gateway_key_b64: &str) -> Result<(), WireError> {
        self.check_header()?;
        let configured = decode_key32(
            "configured gateway public_key_ed25519",
            configured_gateway_key_b64,
        )?;
        let carried = decode_key32(
            "gateway.public_key_ed25519",
            &self.gateway.public_key_ed25519,
        )
        .map_err(|_| WireError::GatewayKeyMismatch)?;
        if carried != configured {
            return Err(WireError::GatewayKeyMismatch);
        }
        self.verify_with(configured_gateway_key_b64)
    }

    pub(super) fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        // time.Time marshals the same in the wire and the signed struct.
        let issued_at = signed_time("gateway.issued_at", &self.gateway.issued_at)?;
        let mut out = Vec::with_capacity(320);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.object("gateway", |g| {
            g.string("gateway_id", &self.gateway.gateway_id);
            g.string("public_key_ed25519", &self.gateway.public_key_ed25519);
            g.string("nonce", &self.gateway.nonce);
            g.string("issued_at", &issued_at);
        });
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairIdentity {
    /// A `pair.identity` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, remote: PairRemoteInfo) -> Self {
        Self {
            msg_type: TYPE_IDENTITY.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            remote,
            sig_ed25519: String::new(),
        }
    }

    /// What the gateway does: verify with the key carried in `remote.public_key_ed25519`.
    /// The message is self-certifying; whether that key is acceptable is policy.
    pub fn verify_self_signed(&self) -> Result<(), WireError> {
        self.verify_with(&self.remote.public_key_ed25519)
    }

    pub(super) fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let r = &self.remote;
        let mut out = Vec::with_capacity(400);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.object("remote", |g| {
            g.string("component_type", &r.component_type);
            g.string("component_id", &r.component_id);
            g.string("public_key_ed25519", &r.public_key_ed25519);
            g.string("public_key_x25519", &r.public_key_x25519);
            g.string("mtls_cert_fingerprint", &r.mtls_cert_fingerprint);
        });
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairChallenge {
    /// A `pair.challenge` with type and version set.
    pub fn new(
        pairing_id: impl Into<String>,
        challenge_id: impl Into<String>,
        ciphertext: impl Into<String>,
        aad: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_CHALLENGE.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            challenge_id: challenge_id.into(),
            ciphertext: ciphertext.into(),
            aad: aad.into(),
        }
    }

    pub(super) fn encode(&self, _signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(512);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("challenge_id", &self.challenge_id);
        o.string("ciphertext", &self.ciphertext);
        if !self.aad.is_empty() {
            o.string("aad", &self.aad);
        }
        o.close();
        Ok(out)
    }
}

impl PairChallengeResponse {
    /// A `pair.challenge_response` with type and version set and no signature.
    pub fn new(
        pairing_id: impl Into<String>,
        challenge_id: impl Into<String>,
        challenge_plaintext: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_CHALLENGE_RESPONSE.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            challenge_id: challenge_id.into(),
            challenge_plaintext: challenge_plaintext.into(),
            sig_ed25519: String::new(),
        }
    }

    pub(super) fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(320);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("challenge_id", &self.challenge_id);
        o.string("challenge_plaintext", &self.challenge_plaintext);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairCsrRequest {
    /// A `pair.csr_request` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, csr_pem: impl Into<String>) -> Self {
        Self {
            msg_type: TYPE_CSR_REQUEST.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            csr_pem: csr_pem.into(),
            sig_ed25519: String::new(),
        }
    }

    pub(super) fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(self.csr_pem.len() + 256);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("csr_pem", &self.csr_pem);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairCsrIssued {
    /// A `pair.csr_issued` with type and version set and no signature.
    pub fn new(
        pairing_id: impl Into<String>,
        certificate_pem: impl Into<String>,
        certificate_chain_pem: Vec<String>,
        serial_number: impl Into<String>,
        mtls_cert_fingerprint: impl Into<String>,
        not_before: impl Into<String>,
        not_after: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_CSR_ISSUED.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            certificate_pem: certificate_pem.into(),
            certificate_chain_pem,
            serial_number: serial_number.into(),
            mtls_cert_fingerprint: mtls_cert_fingerprint.into(),
            not_before: not_before.into(),
            not_after: not_after.into(),
            sig_ed25519: String::new(),
        }
    }

    pub(super) fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        // Signed: t.UTC().Format(RFC3339Nano) strings. Wire: time.Time (offset kept).
        let (not_before, not_after) = if signed {
            (
                signed_time_utc("not_before", &self.not_before)?,
                signed_time_utc("not_after", &self.not_after)?,
            )
        } else {
            (
                signed_time("not_before", &self.not_before)?,
                signed_time("not_after", &self.not_after)?,
            )
        };
        let chain_len: usize = self.certificate_chain_pem.iter().map(String::len).sum();
        let mut out = Vec::with_capacity(self.certificate_pem.len() + chain_len + 512);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("certificate_pem", &self.certificate_pem);
        if !self.certificate_chain_pem.is_empty() {
            o.string_array("certificate_chain_pem", &self.certificate_chain_pem);
        }
        o.string("serial_number", &self.serial_number);
        o.string("mtls_cert_fingerprint", &self.mtls_cert_fingerprint);
        o.string("not_before", &not_before);
        o.string("not_after", &not_after);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairCsrInstalled {
    /// A `pair.csr_installed` with type and version set and no signature.
    pub fn new(pairing_id: impl Into<String>, mtls_cert_fingerprint: impl Into<String>) -> Self {
        Self {
            msg_type: TYPE_CSR_INSTALLED.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            mtls_cert_fingerprint: mtls_cert_fingerprint.into(),
            sig_ed25519: String::new(),
        }
    }

    pub(super) fn encode(&self, signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(256);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("mtls_cert_fingerprint", &self.mtls_cert_fingerprint);
        if !signed {
            o.string("sig_ed25519", &self.sig_ed25519);
        }
        o.close();
        Ok(out)
    }
}

impl PairComplete {
    /// `{"type":"pair.complete","version":"v1","pairing_id":…,"status":"ok"}`.
    pub fn ok(pairing_id: impl Into<String>) -> Self {
        Self {
            msg_type: TYPE_COMPLETE.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            status: STATUS_OK.to_owned(),
        }
    }

    pub(super) fn encode(&self, _signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(128);
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("status", &self.status);
        o.close();
        Ok(out)
    }
}

impl PairError {
    /// A `pair.error` with type and version set.
    pub fn new(
        pairing_id: impl Into<String>,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            msg_type: TYPE_ERROR.to_owned(),
            version: PROTOCOL_VERSION.to_owned(),
            pairing_id: pairing_id.into(),
            code: code.into(),
            message: message.into(),
        }
    }

    /// The error the crabstack sdk remote sends: empty `pairing_id`, code `HANDSHAKE_FAILED`.
    pub fn handshake_failed(message: impl Into<String>) -> Self {
        Self::new("", ERROR_CODE_HANDSHAKE_FAILED, message)
    }

    pub(super) fn encode(&self, _signed: bool) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(128 + self.message.len());
        let mut o = JsonObject::open(&mut out);
        o.string("type", &self.msg_type);
        o.string("version", &self.version);
        o.string("pairing_id", &self.pairing_id);
        o.string("code", &self.code);
        o.string("message", &self.message);
        o.close();
        Ok(out)
    }
}
