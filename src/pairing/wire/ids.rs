//! Certificate fingerprints and random identifiers.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

/// `sha256:` + lowercase hex of SHA-256 over the whole certificate DER.
pub fn fingerprint_der(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// Go `strings.EqualFold(strings.TrimSpace(a), strings.TrimSpace(b))`, with ASCII-only case
/// folding (fingerprints are ASCII; see the module docs).
pub fn fingerprints_match(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    OsRng.fill_bytes(&mut out);
    out
}

/// A new `pairing_id`: 16 random bytes as 32 lowercase hex chars.
pub fn new_pairing_id() -> String {
    hex::encode(random_bytes::<16>())
}

/// A new `challenge_id` (same format as a pairing id).
pub fn new_challenge_id() -> String {
    new_pairing_id()
}

/// A new `gateway.nonce`: standard base64 of 24 random bytes (32 chars).
pub fn new_nonce() -> String {
    BASE64.encode(random_bytes::<24>())
}

/// A new challenge plaintext: standard base64 of 32 random bytes (44 chars); the ASCII
/// string itself is what is encrypted and echoed back.
pub fn new_challenge_plaintext() -> String {
    BASE64.encode(random_bytes::<32>())
}
