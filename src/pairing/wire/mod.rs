//! Wire-compatibility core of the crabstack pairing handshake (protocol `v1`).
//!
//! This module is the byte-exact layer between carapace and a crabstack gateway
//! (`germanoeich/crabstack`, Go). It knows the nine message shapes, how Go's
//! `encoding/json` turns each signed payload into the bytes that are signed, Ed25519
//! signing and verification, the X25519 + SHA-256 + AES-256-GCM challenge encryption,
//! certificate fingerprints and the random identifiers. It holds no handshake state:
//! the order of messages, `pairing_id` equality across steps, the challenge comparison,
//! the CSR self-signature, the certificate/fingerprint/serial checks and key pinning
//! belong to the handshake layer built on top of it.
//!
//! The reference for every rule here is `shared/vectors/crabstack/README.md` §1–§5 and
//! its vectors; the tests at the bottom check all of them.
//!
//! # Signed bytes
//!
//! A signature covers `json.Marshal` of a Go struct holding the message without
//! `sig_ed25519` ([`SignedMessage::signed_bytes`]). The bytes are built by hand in the
//! Go field order with a Go-compatible string encoder ([`append_go_json_string`]):
//! no whitespace, `<` `>` `&` as `\u003c` `\u003e` `\u0026`, U+2028/U+2029 escaped,
//! `\b \f \n \r \t` short escapes, other controls as lowercase `\u00xx`, everything
//! else raw UTF-8. A verifier re-marshals the decoded message; the received bytes are
//! never hashed as such, so key order and unknown fields on the wire do not matter.
//!
//! Timestamps: `pair.init` `gateway.issued_at` is signed as Go re-marshals the parsed
//! `time.Time` (RFC 3339 with nanoseconds, trailing zeros trimmed, offset kept, `Z` for a
//! zero offset); `pair.csr_issued` `not_before`/`not_after` are signed converted to UTC.
//! A timestamp that does not parse makes signing and verifying fail ([`WireError::BadTime`]).
//!
//! # Decoding policy
//!
//! Decoding ([`WireMessage::from_wire`]) follows Go's `json.Unmarshal` where that matters
//! for interop and fails closed elsewhere:
//!
//! * unknown fields are ignored, key order is free, a trailing newline is fine;
//! * a missing field decodes as the empty string / empty list (Go's zero value), which is
//!   then part of the re-marshalled signed bytes exactly as in Go;
//! * **refused, unlike Go:** keys in another letter case (`PAIRING_ID` is an unknown field
//!   here, so `pairing_id` stays empty and the signature fails), duplicate keys (decode
//!   error; Go keeps the last), `null` for a string field (decode error; Go keeps the zero
//!   value), a lone UTF-16 surrogate escape (decode error; Go substitutes U+FFFD);
//! * **refused, unlike Go:** timestamps that only Go's lenient fallback parser accepts
//!   (one-digit hour, `,` as fraction separator, offset hour `24`, `t`/`z` in lower case);
//!   the gateway only ever sends the canonical form;
//! * **stricter than Go:** base64 is the standard alphabet with canonical `=` padding and
//!   zero trailing bits, with no embedded newlines (Go's `StdEncoding` tolerates `\r\n` and
//!   non-zero trailing bits);
//! * fingerprints compare with ASCII case folding after trimming whitespace ([`fingerprints_match`]);
//!   Go's `EqualFold` also folds a few non-ASCII letters (`ſ`, `K`), which are refused here.

mod error;
pub use error::WireError;
mod go_json;
pub use go_json::{append_go_json_string, go_json_string};
mod go_time;
pub use go_time::{civil_from_days, GoTime};
mod signing;
pub use signing::{verify, SigningIdentity};
mod messages;
pub use messages::{
    decode_message, message_type, PairChallenge, PairChallengeResponse, PairComplete,
    PairCsrInstalled, PairCsrIssued, PairCsrRequest, PairError, PairGatewayInfo, PairIdentity,
    PairInit, PairMessage, PairRemoteInfo, SignedMessage, WireMessage,
};
mod challenge;
mod encoding;
pub use challenge::{open_challenge, seal_challenge, seal_challenge_with, x25519_public_b64};
mod ids;
pub use ids::{
    fingerprint_der, fingerprints_match, new_challenge_id, new_challenge_plaintext, new_nonce,
    new_pairing_id,
};
#[cfg(test)]
mod tests;

/// The only protocol version (`version` field of every message).
pub const PROTOCOL_VERSION: &str = "v1";
/// `type` of the gateway's signed initiation.
pub const TYPE_INIT: &str = "pair.init";
/// `type` of the remote's signed identity.
pub const TYPE_IDENTITY: &str = "pair.identity";
/// `type` of the gateway's encrypted challenge.
pub const TYPE_CHALLENGE: &str = "pair.challenge";
/// `type` of the remote's signed challenge answer.
pub const TYPE_CHALLENGE_RESPONSE: &str = "pair.challenge_response";
/// `type` of the remote's signed CSR.
pub const TYPE_CSR_REQUEST: &str = "pair.csr_request";
/// `type` of the gateway's signed certificate issuance.
pub const TYPE_CSR_ISSUED: &str = "pair.csr_issued";
/// `type` of the remote's signed installation confirmation.
pub const TYPE_CSR_INSTALLED: &str = "pair.csr_installed";
/// `type` of the gateway's final message.
pub const TYPE_COMPLETE: &str = "pair.complete";
/// `type` of the error message (sent by the remote only; the gateway just closes).
pub const TYPE_ERROR: &str = "pair.error";
/// `status` of `pair.complete`.
pub const STATUS_OK: &str = "ok";
/// `code` the crabstack sdk remote puts into its `pair.error`.
pub const ERROR_CODE_HANDSHAKE_FAILED: &str = "HANDSHAKE_FAILED";
/// Read limit both Go sides apply to one WebSocket message.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Negative vectors (`pairing_negative.json`) that this module does **not** refuse because
/// the check belongs to the handshake state machine; the handshake layer's tests must
/// cover each of them. Every other negative vector is refused by this module's tests.
#[cfg(test)]
pub(crate) const HANDSHAKE_CHECKED: &[&str] = &[
    // Valid gateway signature; the remote must check fingerprint(certificate_pem) ==
    // mtls_cert_fingerprint (sdk flow.go:407-413).
    "issued.cert_swapped_resigned",
    // Valid remote signature; the gateway must compare challenge_plaintext with what it
    // encrypted, in constant time (manager.go:227-229).
    "response.wrong_plaintext_resigned",
    // Valid remote signature; the CA must check the CSR's own ECDSA signature (ca.go:232-245).
    "csr.self_signature_broken_resigned",
    // Valid remote signature; the gateway must EqualFold the fingerprint against the one
    // it issued (manager.go:285-287).
    "installed.other_fingerprint_resigned",
];
