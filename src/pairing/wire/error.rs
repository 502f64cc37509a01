//! Wire-level errors.

/// Everything that can go wrong at the wire level. Each variant names what failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The text is not valid JSON for the message shape (also: duplicate keys, `null`
    /// for a string, trailing content).
    #[error("invalid pairing message json: {0}")]
    Json(#[from] serde_json::Error),
    /// The message has no (or an empty / null) `type`.
    #[error("pairing message has no type")]
    MissingType,
    /// `type` is not one of the nine pairing message types.
    #[error("unknown pairing message type {0:?}")]
    UnknownType(String),
    /// `type` is not the one this message shape requires (compared exactly).
    #[error("unexpected pairing message type {found:?} (expected {expected:?})")]
    WrongType {
        /// The required type.
        expected: &'static str,
        /// The type on the wire.
        found: String,
    },
    /// `version` is not `v1`.
    #[error("unsupported pairing version {0:?}")]
    WrongVersion(String),
    /// A base64 field is not canonical standard base64 with padding.
    #[error("{field}: invalid base64")]
    BadBase64 {
        /// The field that failed.
        field: &'static str,
    },
    /// A public key (Ed25519 or X25519) does not decode to 32 bytes.
    #[error("{field}: expected a {expected}-byte key, got {actual} bytes")]
    BadKeyLength {
        /// The field that failed.
        field: &'static str,
        /// Required length.
        expected: usize,
        /// Decoded length.
        actual: usize,
    },
    /// `sig_ed25519` does not decode to 64 bytes.
    #[error("sig_ed25519: expected a 64-byte signature, got {0} bytes")]
    BadSignatureLength(usize),
    /// The Ed25519 seed was rejected.
    #[error("invalid ed25519 seed")]
    BadSeed,
    /// `sig_ed25519` is empty.
    #[error("signature is required")]
    MissingSignature,
    /// The Ed25519 signature does not verify over the re-marshalled signed bytes.
    #[error("signature verification failed")]
    BadSignature,
    /// `pair.init` carries a gateway key other than the configured one.
    #[error("gateway public key mismatch")]
    GatewayKeyMismatch,
    /// A timestamp is not an RFC 3339 time Go accepts, or cannot be re-encoded.
    #[error("{field}: invalid RFC 3339 time {value:?}")]
    BadTime {
        /// The field that failed.
        field: &'static str,
        /// The value on the wire.
        value: String,
    },
    /// The challenge AAD is not the JSON object `{pairing_id, challenge_id, ephemeral_public_key_x25519}`.
    #[error("parse challenge aad: {0}")]
    BadAad(String),
    /// The AAD's `pairing_id`/`challenge_id` differ from the message's.
    #[error("challenge aad mismatch")]
    AadMismatch,
    /// The challenge ciphertext is shorter than nonce + tag.
    #[error("ciphertext too short")]
    CiphertextTooShort,
    /// The X25519 agreement gave the all-zero secret (low-order public key); Go refuses it too.
    #[error("x25519 key agreement with a low-order public key")]
    LowOrderKey,
    /// AES-256-GCM authentication failed (wrong key, AAD, nonce, tag or ciphertext).
    #[error("decrypt challenge: message authentication failed")]
    DecryptionFailed,
    /// AES-256-GCM sealing failed (cannot happen for challenge-sized input).
    #[error("encrypt challenge failed")]
    EncryptionFailed,
}
