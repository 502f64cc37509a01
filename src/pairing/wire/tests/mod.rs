use std::time::SystemTime;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::Value;
use x25519_dalek::StaticSecret;

use super::challenge::{
    challenge_aad_bytes, derive_challenge_key, new_x25519_secret, open_challenge, seal_challenge,
    seal_challenge_with, x25519_agree, x25519_public_b64, ChallengeAad,
};
use super::error::WireError;
use super::go_json::{append_go_json_string, go_json_string};
use super::go_time::{civil_from_days, days_from_civil, days_in_month, GoTime};
use super::ids::{
    fingerprint_der, fingerprints_match, new_challenge_id, new_challenge_plaintext, new_nonce,
    new_pairing_id,
};
use super::messages::{
    decode_message, message_type, PairChallenge, PairChallengeResponse, PairComplete,
    PairCsrInstalled, PairCsrIssued, PairCsrRequest, PairError, PairGatewayInfo, PairIdentity,
    PairInit, PairMessage, PairRemoteInfo, SignedMessage,
};
use super::signing::{decode_key32, verify, SigningIdentity};
use super::{
    HANDSHAKE_CHECKED, STATUS_OK, TYPE_CHALLENGE, TYPE_CHALLENGE_RESPONSE, TYPE_CSR_INSTALLED,
    TYPE_CSR_ISSUED, TYPE_CSR_REQUEST, TYPE_IDENTITY, TYPE_INIT, *,
};

mod encoding;
mod policy;
mod refusals;
mod transcript;

fn vectors_path(name: &str) -> String {
    format!(
        "{}/{name}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/vectors/crabstack")
    )
}

fn load(name: &str) -> Value {
    let path = vectors_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).expect("vector file is JSON")
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("missing string {key}"))
}

fn b64(v: &str) -> Vec<u8> {
    BASE64.decode(v).expect("vector base64")
}

fn seed(hex_str: &str) -> [u8; 32] {
    hex::decode(hex_str).unwrap().try_into().unwrap()
}

fn transcript() -> Value {
    load("pairing_transcript.json")
}

fn gateway_identity(t: &Value) -> SigningIdentity {
    SigningIdentity::from_seed(&seed(s(&t["keys"]["gateway_ed25519"], "seed_hex"))).unwrap()
}

fn remote_identity(t: &Value) -> SigningIdentity {
    SigningIdentity::from_seed(&seed(s(&t["keys"]["remote_ed25519"], "seed_hex"))).unwrap()
}

fn remote_x25519(t: &Value) -> StaticSecret {
    StaticSecret::from(seed(s(&t["keys"]["remote_x25519"], "private_key_hex")))
}

/// PEM body → DER (test helper; one block).
fn pem_to_der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    b64(&body)
}

/// Parse, check round trip, signed bytes, verification and re-signing for one signed
/// message type. Returns the decoded message.
fn check_signed<M: SignedMessage>(
    wire_text: &str,
    signed_b64: &str,
    key_b64: &str,
    signer: Option<&SigningIdentity>,
) -> M {
    let msg = M::from_wire(wire_text).expect("decodes");
    assert_eq!(msg.to_wire().unwrap(), wire_text, "wire re-encoding");
    assert_eq!(
        String::from_utf8(msg.signed_bytes().unwrap()).unwrap(),
        String::from_utf8(b64(signed_b64)).unwrap(),
        "signed bytes of {}",
        M::TYPE
    );
    msg.verify_with(key_b64).expect("verifies");
    if let Some(id) = signer {
        // Ed25519 is deterministic: re-signing reproduces the vector's signature.
        let mut resigned = M::from_wire(wire_text).unwrap();
        resigned.set_signature(String::new());
        resigned.sign_with(id).unwrap();
        assert_eq!(
            resigned.signature(),
            msg.signature(),
            "re-signed {}",
            M::TYPE
        );
    }
    msg
}
