//! Challenge encryption: X25519 + SHA-256 + AES-256-GCM.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore as _;
use ring::aead;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use x25519_dalek::{PublicKey as X25519PublicKey, SharedSecret, StaticSecret};

use super::error::WireError;
use super::go_json::JsonObject;
use super::messages::{decode_object, PairChallenge, WireMessage};
use super::signing::{decode_b64, decode_key32};

const GCM_NONCE_LEN: usize = 12;
const GCM_TAG_LEN: usize = 16;

/// The AAD JSON object (Go struct `challengeAAD`, this field order).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ChallengeAad {
    pub(super) pairing_id: String,
    pub(super) challenge_id: String,
    pub(super) ephemeral_public_key_x25519: String,
}

pub(super) fn challenge_aad_bytes(
    pairing_id: &str,
    challenge_id: &str,
    ephemeral_public_b64: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    let mut o = JsonObject::open(&mut out);
    o.string("pairing_id", pairing_id);
    o.string("challenge_id", challenge_id);
    o.string("ephemeral_public_key_x25519", ephemeral_public_b64);
    o.close();
    out
}

pub(super) fn x25519_agree(
    secret: &StaticSecret,
    public: [u8; 32],
) -> Result<SharedSecret, WireError> {
    let shared = secret.diffie_hellman(&X25519PublicKey::from(public));
    if !shared.was_contributory() {
        return Err(WireError::LowOrderKey);
    }
    Ok(shared)
}

/// `SHA-256(shared || aad_bytes)`, the AES-256 key.
pub(super) fn derive_challenge_key(shared: &SharedSecret, aad: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(shared.as_bytes());
    h.update(aad);
    h.finalize().into()
}

fn aes_key(key: &[u8; 32]) -> aead::LessSafeKey {
    let unbound = aead::UnboundKey::new(&aead::AES_256_GCM, key)
        .expect("a 32-byte key is a valid AES-256 key");
    aead::LessSafeKey::new(unbound)
}

/// Encrypts a challenge for the remote's X25519 key with a random ephemeral key and nonce.
/// Returns `(ciphertext_b64, aad_b64)`, the `ciphertext` and `aad` fields of `pair.challenge`.
pub fn seal_challenge(
    remote_x25519_public_b64: &str,
    pairing_id: &str,
    challenge_id: &str,
    plaintext: &[u8],
) -> Result<(String, String), WireError> {
    let mut ephemeral = [0u8; 32];
    OsRng.fill_bytes(&mut ephemeral);
    let mut nonce = [0u8; GCM_NONCE_LEN];
    OsRng.fill_bytes(&mut nonce);
    seal_challenge_with(
        remote_x25519_public_b64,
        pairing_id,
        challenge_id,
        plaintext,
        ephemeral,
        nonce,
    )
}

/// [`seal_challenge`] with the ephemeral X25519 secret and the GCM nonce given (for
/// deterministic tests; never reuse either). Steps (gateway `crypto.go`): `shared =
/// X25519(eph, remote)`; `aad = json.Marshal({pairing_id, challenge_id,
/// ephemeral_public_key_x25519})`; `key = SHA-256(shared || aad)`; `ciphertext =
/// base64(nonce || AES-256-GCM(key).Seal(nonce, plaintext, aad))`.
pub fn seal_challenge_with(
    remote_x25519_public_b64: &str,
    pairing_id: &str,
    challenge_id: &str,
    plaintext: &[u8],
    ephemeral_secret: [u8; 32],
    nonce: [u8; 12],
) -> Result<(String, String), WireError> {
    let remote = decode_key32("remote.public_key_x25519", remote_x25519_public_b64)?;
    let ephemeral = StaticSecret::from(ephemeral_secret);
    let ephemeral_public = X25519PublicKey::from(&ephemeral);
    let shared = x25519_agree(&ephemeral, remote)?;
    let aad = challenge_aad_bytes(
        pairing_id,
        challenge_id,
        &BASE64.encode(ephemeral_public.as_bytes()),
    );
    let key = derive_challenge_key(&shared, &aad);
    let mut sealed = Vec::with_capacity(GCM_NONCE_LEN + plaintext.len() + GCM_TAG_LEN);
    sealed.extend_from_slice(&nonce);
    sealed.extend_from_slice(plaintext);
    let mut body = sealed.split_off(GCM_NONCE_LEN);
    aes_key(&key)
        .seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad.as_slice()),
            &mut body,
        )
        .map_err(|_| WireError::EncryptionFailed)?;
    sealed.extend_from_slice(&body);
    Ok((BASE64.encode(&sealed), BASE64.encode(&aad)))
}

/// Decrypts a `pair.challenge` with the remote's X25519 secret (sdk
/// `DecryptPairChallenge`): checks type/version; decodes the AAD JSON and requires its
/// `pairing_id`/`challenge_id` to equal the message's; takes the ephemeral key from the
/// AAD; derives the key from the AAD bytes exactly as received; opens AES-256-GCM.
/// Returns the plaintext (the remote echoes it as `challenge_plaintext`).
pub fn open_challenge(
    remote_secret: &StaticSecret,
    msg: &PairChallenge,
) -> Result<Vec<u8>, WireError> {
    msg.check_header()?;
    let aad = decode_b64("aad", &msg.aad)?;
    let meta: ChallengeAad =
        decode_object(&aad, &[]).map_err(|e| WireError::BadAad(e.to_string()))?;
    if meta.pairing_id != msg.pairing_id || meta.challenge_id != msg.challenge_id {
        return Err(WireError::AadMismatch);
    }
    let ephemeral = decode_key32(
        "aad.ephemeral_public_key_x25519",
        &meta.ephemeral_public_key_x25519,
    )?;
    let shared = x25519_agree(remote_secret, ephemeral)?;
    let key = derive_challenge_key(&shared, &aad);
    let mut data = decode_b64("ciphertext", &msg.ciphertext)?;
    if data.len() < GCM_NONCE_LEN + GCM_TAG_LEN {
        return Err(WireError::CiphertextTooShort);
    }
    let mut body = data.split_off(GCM_NONCE_LEN);
    let nonce =
        <[u8; GCM_NONCE_LEN]>::try_from(data.as_slice()).expect("split at the nonce length");
    let plaintext = aes_key(&key)
        .open_in_place(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad.as_slice()),
            &mut body,
        )
        .map_err(|_| WireError::DecryptionFailed)?;
    Ok(plaintext.to_vec())
}

/// A fresh random X25519 secret (tests; identities persist theirs).
#[cfg(test)]
pub(super) fn new_x25519_secret() -> StaticSecret {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    StaticSecret::from(bytes)
}

/// Standard base64 of the X25519 public key of `secret` (wire form of `public_key_x25519`).
pub fn x25519_public_b64(secret: &StaticSecret) -> String {
    BASE64.encode(X25519PublicKey::from(secret).as_bytes())
}
