//! HMAC-SHA256 signing and constant-time verification.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

fn mac_over(secret: &[u8], msg: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length (long keys are hashed first), so this cannot fail.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(msg);
    mac
}

/// HMAC-SHA256(key = secret bytes, msg) as lowercase hex.
pub fn hmac_sha256_hex(secret: &[u8], msg: &[u8]) -> String {
    hex::encode(mac_over(secret, msg).finalize().into_bytes())
}

/// Constant-time check of a hex signature against HMAC-SHA256(secret, msg).
///
/// Only exactly 64 lowercase hex characters are accepted (that is what Vagus sends); anything
/// else is a mismatch. The comparison of the decoded bytes is constant time
/// (`Mac::verify_slice`); the format check only depends on the untrusted input.
pub fn verify_hmac_sha256_hex(secret: &[u8], msg: &[u8], signature_hex: &str) -> bool {
    let sig = signature_hex.as_bytes();
    if sig.len() != 64 || !sig.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return false;
    }
    let mut raw = [0u8; 32];
    if hex::decode_to_slice(sig, &mut raw).is_err() {
        return false;
    }
    mac_over(secret, msg).verify_slice(&raw).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_rfc4231_case_2_and_signature_format() {
        let sig = hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(verify_hmac_sha256_hex(
            b"Jefe",
            b"what do ya want for nothing?",
            &sig
        ));
        for bad in [
            "",
            &sig[..62],
            &format!("{sig}00"),
            &sig.to_uppercase(),
            &format!(" {}", &sig[1..]),
            &format!("{}g", &sig[..63]),
        ] {
            assert!(
                !verify_hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?", bad),
                "{bad:?}"
            );
        }
    }
}
