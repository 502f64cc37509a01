//! Strict base64, Ed25519 identities and signature verification.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore as _;
use ring::signature::{Ed25519KeyPair, KeyPair as _, UnparsedPublicKey, ED25519};

use super::error::WireError;

pub(super) fn decode_b64(field: &'static str, value: &str) -> Result<Vec<u8>, WireError> {
    BASE64
        .decode(value)
        .map_err(|_| WireError::BadBase64 { field })
}

pub(super) fn decode_key32(field: &'static str, value: &str) -> Result<[u8; 32], WireError> {
    let bytes = decode_b64(field, value)?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| WireError::BadKeyLength {
        field,
        expected: 32,
        actual: bytes.len(),
    })
}

/// An Ed25519 signing key (the gateway's or the remote's long-term identity).
pub struct SigningIdentity {
    key: Ed25519KeyPair,
}

impl SigningIdentity {
    /// The key for a 32-byte seed (Go `ed25519.NewKeyFromSeed`; the seed is the first half
    /// of Go's 64-byte private key).
    pub fn from_seed(seed: &[u8; 32]) -> Result<Self, WireError> {
        Ed25519KeyPair::from_seed_unchecked(seed)
            .map(|key| Self { key })
            .map_err(|_| WireError::BadSeed)
    }

    /// A fresh random key and its seed (keep the seed to load the key again).
    pub fn generate() -> (Self, [u8; 32]) {
        let mut seed = [0u8; 32];
        OsRng.fill_bytes(&mut seed);
        let identity = Self::from_seed(&seed).expect("every 32-byte seed is a valid ed25519 seed");
        (identity, seed)
    }

    /// The raw 32-byte public key.
    pub fn public_key_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.key.public_key().as_ref());
        out
    }

    /// The public key as standard base64 (the wire form of `public_key_ed25519`).
    pub fn public_key_b64(&self) -> String {
        BASE64.encode(self.key.public_key().as_ref())
    }

    /// The 64-byte signature of `msg`.
    pub fn sign_bytes(&self, msg: &[u8]) -> Vec<u8> {
        self.key.sign(msg).as_ref().to_vec()
    }

    /// Signs `msg`; standard base64 of the 64-byte signature (the wire form of `sig_ed25519`).
    pub fn sign(&self, msg: &[u8]) -> String {
        BASE64.encode(self.key.sign(msg).as_ref())
    }
}

impl fmt::Debug for SigningIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningIdentity")
            .field("public_key_ed25519", &self.public_key_b64())
            .finish_non_exhaustive()
    }
}

/// Verifies an Ed25519 signature: `public_key_b64` must be base64 of 32 bytes, `sig_b64`
/// non-empty base64 of 64 bytes (strict base64, see the module docs).
pub fn verify(public_key_b64: &str, msg: &[u8], sig_b64: &str) -> Result<(), WireError> {
    let key = decode_key32("public_key_ed25519", public_key_b64)?;
    if sig_b64.is_empty() {
        return Err(WireError::MissingSignature);
    }
    let sig = decode_b64("sig_ed25519", sig_b64)?;
    if sig.len() != 64 {
        return Err(WireError::BadSignatureLength(sig.len()));
    }
    UnparsedPublicKey::new(&ED25519, key)
        .verify(msg, &sig)
        .map_err(|_| WireError::BadSignature)
}
