//! The nine message shapes, their common traits and decoding any message by its `type`.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::WireError;
use super::signing::{verify, SigningIdentity};
use super::{
    PROTOCOL_VERSION, TYPE_CHALLENGE, TYPE_CHALLENGE_RESPONSE, TYPE_COMPLETE, TYPE_CSR_INSTALLED,
    TYPE_CSR_ISSUED, TYPE_CSR_REQUEST, TYPE_ERROR, TYPE_IDENTITY, TYPE_INIT,
};

/// `gateway` object of `pair.init`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairGatewayInfo {
    /// Gateway id (`gateway_id` from its identity file).
    pub gateway_id: String,
    /// Base64 Ed25519 public key of the gateway.
    pub public_key_ed25519: String,
    /// Base64 of 24 random bytes.
    pub nonce: String,
    /// RFC 3339 time (signed re-formatted Go style, see [`GoTime`]).
    pub issued_at: String,
}

/// `pair.init` (gateway → remote), signed by the gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairInit {
    /// `pair.init`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// 32 lowercase hex chars.
    pub pairing_id: String,
    /// The gateway's identity.
    pub gateway: PairGatewayInfo,
    /// Base64 Ed25519 signature over [`SignedMessage::signed_bytes`].
    pub sig_ed25519: String,
}

/// `remote` object of `pair.identity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairRemoteInfo {
    /// `tool_host`, `subscriber`, `operator`, ….
    pub component_type: String,
    /// The requested component id.
    pub component_id: String,
    /// Base64 Ed25519 public key of the remote (the message is verified with it).
    pub public_key_ed25519: String,
    /// Base64 X25519 public key the challenge is encrypted to.
    pub public_key_x25519: String,
    /// `sha256:<hex>` of the TLS certificate of the pairing endpoint, or empty (signed
    /// even when empty).
    pub mtls_cert_fingerprint: String,
}

/// `pair.identity` (remote → gateway), signed by the remote with the key it carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairIdentity {
    /// `pair.identity`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id from `pair.init`.
    pub pairing_id: String,
    /// The remote's identity.
    pub remote: PairRemoteInfo,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.challenge` (gateway → remote), not signed; authenticated by AES-GCM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairChallenge {
    /// `pair.challenge`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// 32 lowercase hex chars.
    pub challenge_id: String,
    /// Base64 of `nonce(12) || AES-256-GCM ciphertext || tag(16)`.
    pub ciphertext: String,
    /// Base64 of the AAD JSON bytes; omitted on the wire when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub aad: String,
}

/// `pair.challenge_response` (remote → gateway), signed by the remote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairChallengeResponse {
    /// `pair.challenge_response`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// The challenge id being answered.
    pub challenge_id: String,
    /// The decrypted challenge, verbatim (an ASCII base64 string).
    pub challenge_plaintext: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.csr_request` (remote → gateway), signed by the remote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairCsrRequest {
    /// `pair.csr_request`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// PEM `CERTIFICATE REQUEST` (Go `pem.EncodeToMemory` layout).
    pub csr_pem: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.csr_issued` (gateway → remote), signed by the gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairCsrIssued {
    /// `pair.csr_issued`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// PEM of the issued certificate.
    pub certificate_pem: String,
    /// PEMs of the chain (the pairing CA); omitted on the wire and in the signed bytes
    /// when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificate_chain_pem: Vec<String>,
    /// Lowercase hex serial, no leading zeros.
    pub serial_number: String,
    /// `sha256:<hex>` of the issued certificate's DER.
    pub mtls_cert_fingerprint: String,
    /// RFC 3339 (signed converted to UTC).
    pub not_before: String,
    /// RFC 3339 (signed converted to UTC).
    pub not_after: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.csr_installed` (remote → gateway), signed by the remote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairCsrInstalled {
    /// `pair.csr_installed`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// Fingerprint of the installed certificate, exactly the string that is signed.
    pub mtls_cert_fingerprint: String,
    /// Base64 Ed25519 signature.
    pub sig_ed25519: String,
}

/// `pair.complete` (gateway → remote), not signed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairComplete {
    /// `pair.complete`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id.
    pub pairing_id: String,
    /// `ok`.
    pub status: String,
}

/// `pair.error`, not signed. The crabstack sdk remote sends it with an empty
/// `pairing_id` and code `HANDSHAKE_FAILED`; the gateway never sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairError {
    /// `pair.error`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// `v1`.
    pub version: String,
    /// The pairing id (empty from the sdk).
    pub pairing_id: String,
    /// Error code.
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

/// Decodes a JSON object into `T`. serde's derived structs also accept a JSON array
/// (fields by position), which Go refuses; so the top level and the `nested` keys are
/// first checked to be objects, then `T` is decoded from the same bytes (which keeps
/// serde's duplicate-key refusal).
pub(super) fn decode_object<T: DeserializeOwned>(
    bytes: &[u8],
    nested: &[&str],
) -> Result<T, serde_json::Error> {
    use serde::de::Error as _;
    let value: serde_json::Value = serde_json::from_slice(bytes)?;
    let object = value
        .as_object()
        .ok_or_else(|| serde_json::Error::custom("expected a JSON object"))?;
    for key in nested {
        if let Some(v) = object.get(*key) {
            if !v.is_object() {
                return Err(serde_json::Error::custom(format!(
                    "{key}: expected a JSON object"
                )));
            }
        }
    }
    serde_json::from_slice(bytes)
}

/// Common behaviour of the nine message shapes.
pub trait WireMessage: Sized + DeserializeOwned {
    /// The `type` this shape requires.
    const TYPE: &'static str;
    /// Keys whose values are nested Go structs (must be JSON objects when present).
    const NESTED_OBJECTS: &'static [&'static str] = &[];

    /// `type` as received / set.
    fn msg_type(&self) -> &str;
    /// `version` as received / set.
    fn version(&self) -> &str;
    /// `pairing_id` as received / set.
    fn pairing_id(&self) -> &str;

    /// The message exactly as Go's `conn.WriteJSON` puts it in the text frame: Go
    /// `json.Marshal` of the wire struct plus `\n`. Fails only for a time field that
    /// does not parse.
    fn to_wire(&self) -> Result<String, WireError>;

    /// Decodes one message (see the module docs for the decoding policy). Does not check
    /// `type`/`version`; use [`WireMessage::check_header`] or [`SignedMessage::verify_with`].
    fn from_wire(text: &str) -> Result<Self, WireError> {
        Ok(decode_object(text.as_bytes(), Self::NESTED_OBJECTS)?)
    }

    /// `type` must equal [`WireMessage::TYPE`] exactly and `version` must be `v1`.
    fn check_header(&self) -> Result<(), WireError> {
        if self.msg_type() != Self::TYPE {
            return Err(WireError::WrongType {
                expected: Self::TYPE,
                found: self.msg_type().to_owned(),
            });
        }
        if self.version() != PROTOCOL_VERSION {
            return Err(WireError::WrongVersion(self.version().to_owned()));
        }
        Ok(())
    }
}

/// The six signed message shapes.
pub trait SignedMessage: WireMessage {
    /// Go `json.Marshal` of the signed payload struct (README §2.1), byte for byte.
    /// Fails only for a time field that does not parse.
    fn signed_bytes(&self) -> Result<Vec<u8>, WireError>;
    /// `sig_ed25519`.
    fn signature(&self) -> &str;
    /// Replaces `sig_ed25519`.
    fn set_signature(&mut self, sig_b64: String);

    /// Checks the header and sets `sig_ed25519` to the signature over the signed bytes.
    fn sign_with(&mut self, identity: &SigningIdentity) -> Result<(), WireError> {
        self.check_header()?;
        let bytes = self.signed_bytes()?;
        self.set_signature(identity.sign(&bytes));
        Ok(())
    }

    /// Checks `type`/`version`, then verifies `sig_ed25519` with `public_key_b64` over the
    /// re-marshalled signed bytes (never over the received text).
    fn verify_with(&self, public_key_b64: &str) -> Result<(), WireError> {
        self.check_header()?;
        if self.signature().is_empty() {
            return Err(WireError::MissingSignature);
        }
        let bytes = self.signed_bytes()?;
        verify(public_key_b64, &bytes, self.signature())
    }
}

macro_rules! wire_message {
    ($ty:ty, $name:expr) => {
        wire_message!($ty, $name, []);
    };
    ($ty:ty, $name:expr, [$($nested:expr),*]) => {
        impl WireMessage for $ty {
            const TYPE: &'static str = $name;
            const NESTED_OBJECTS: &'static [&'static str] = &[$($nested),*];

            fn msg_type(&self) -> &str {
                &self.msg_type
            }

            fn version(&self) -> &str {
                &self.version
            }

            fn pairing_id(&self) -> &str {
                &self.pairing_id
            }

            fn to_wire(&self) -> Result<String, WireError> {
                let mut bytes = self.encode(false)?;
                bytes.push(b'\n');
                Ok(String::from_utf8(bytes).expect("Go JSON encoding of str fields is UTF-8"))
            }
        }
    };
}

macro_rules! signed_message {
    ($ty:ty) => {
        impl SignedMessage for $ty {
            fn signed_bytes(&self) -> Result<Vec<u8>, WireError> {
                self.encode(true)
            }

            fn signature(&self) -> &str {
                &self.sig_ed25519
            }

            fn set_signature(&mut self, sig_b64: String) {
                self.sig_ed25519 = sig_b64;
            }
        }
    };
}

wire_message!(PairInit, TYPE_INIT, ["gateway"]);
wire_message!(PairIdentity, TYPE_IDENTITY, ["remote"]);
wire_message!(PairChallenge, TYPE_CHALLENGE);
wire_message!(PairChallengeResponse, TYPE_CHALLENGE_RESPONSE);
wire_message!(PairCsrRequest, TYPE_CSR_REQUEST);
wire_message!(PairCsrIssued, TYPE_CSR_ISSUED);
wire_message!(PairCsrInstalled, TYPE_CSR_INSTALLED);
wire_message!(PairComplete, TYPE_COMPLETE);
wire_message!(PairError, TYPE_ERROR);
signed_message!(PairInit);
signed_message!(PairIdentity);
signed_message!(PairChallengeResponse);
signed_message!(PairCsrRequest);
signed_message!(PairCsrIssued);
signed_message!(PairCsrInstalled);

/// Any pairing message, decoded by its `type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairMessage {
    /// `pair.init`.
    Init(PairInit),
    /// `pair.identity`.
    Identity(PairIdentity),
    /// `pair.challenge`.
    Challenge(PairChallenge),
    /// `pair.challenge_response`.
    ChallengeResponse(PairChallengeResponse),
    /// `pair.csr_request`.
    CsrRequest(PairCsrRequest),
    /// `pair.csr_issued`.
    CsrIssued(PairCsrIssued),
    /// `pair.csr_installed`.
    CsrInstalled(PairCsrInstalled),
    /// `pair.complete`.
    Complete(PairComplete),
    /// `pair.error`.
    Error(PairError),
}

/// The `type` of a message without decoding the rest (the text must still be one JSON
/// object). Missing, empty or `null` type → [`WireError::MissingType`].
pub fn message_type(text: &str) -> Result<String, WireError> {
    #[derive(Deserialize)]
    struct Peek {
        #[serde(rename = "type", default)]
        msg_type: Option<String>,
    }
    let peek: Peek = decode_object(text.as_bytes(), &[])?;
    match peek.msg_type {
        Some(t) if !t.is_empty() => Ok(t),
        _ => Err(WireError::MissingType),
    }
}

/// Decodes a message of any of the nine types (dispatching on the exact `type`).
pub fn decode_message(text: &str) -> Result<PairMessage, WireError> {
    let t = message_type(text)?;
    Ok(match t.as_str() {
        TYPE_INIT => PairMessage::Init(PairInit::from_wire(text)?),
        TYPE_IDENTITY => PairMessage::Identity(PairIdentity::from_wire(text)?),
        TYPE_CHALLENGE => PairMessage::Challenge(PairChallenge::from_wire(text)?),
        TYPE_CHALLENGE_RESPONSE => {
            PairMessage::ChallengeResponse(PairChallengeResponse::from_wire(text)?)
        }
        TYPE_CSR_REQUEST => PairMessage::CsrRequest(PairCsrRequest::from_wire(text)?),
        TYPE_CSR_ISSUED => PairMessage::CsrIssued(PairCsrIssued::from_wire(text)?),
        TYPE_CSR_INSTALLED => PairMessage::CsrInstalled(PairCsrInstalled::from_wire(text)?),
        TYPE_COMPLETE => PairMessage::Complete(PairComplete::from_wire(text)?),
        TYPE_ERROR => PairMessage::Error(PairError::from_wire(text)?),
        _ => return Err(WireError::UnknownType(t)),
    })
}
