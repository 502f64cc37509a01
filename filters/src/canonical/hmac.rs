//! HMAC-SHA256 signing and constant-time verification.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// An HMAC-SHA256 key made ready once (its inner and outer pads hashed), then used for any
/// number of messages, each started from a copy of that state: a verifier keeps one per
/// configured secret instead of hashing the pads again on every call. Its `Debug` never
/// shows the key.
#[derive(Clone)]
pub struct HmacSha256Key(HmacSha256);

impl HmacSha256Key {
    /// HMAC accepts keys of any length (a key longer than a block is hashed first).
    pub fn new(secret: &[u8]) -> Self {
        HmacSha256Key(
            <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length"),
        )
    }

    /// HMAC-SHA256(key, msg) as lowercase hex.
    pub fn sign_hex(&self, msg: &[u8]) -> String {
        let mut mac = self.0.clone();
        mac.update(msg);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Constant-time check of a hex signature against HMAC-SHA256(key, msg).
    ///
    /// Only exactly 64 lowercase hex characters are accepted (that is what Vagus sends);
    /// anything else is a mismatch. The comparison of the decoded bytes is constant time
    /// (`Mac::verify_slice`); the format check only depends on the untrusted input.
    pub fn verify_hex(&self, msg: &[u8], signature_hex: &str) -> bool {
        decode_signature_hex(signature_hex).is_some_and(|raw| self.verify(msg, &raw))
    }

    /// Constant-time check of raw signature bytes against HMAC-SHA256(key, msg) (a length
    /// other than 32 bytes is a mismatch).
    pub fn verify(&self, msg: &[u8], signature: &[u8]) -> bool {
        let mut mac = self.0.clone();
        mac.update(msg);
        mac.verify_slice(signature).is_ok()
    }
}

impl std::fmt::Debug for HmacSha256Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacSha256Key(<redacted>)")
    }
}

/// The value of each lowercase hex digit, and [`NOT_HEX`] for every other byte.
const HEX_DIGIT: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// A byte that is not a lowercase hex digit, in [`HEX_DIGIT`]: any value with a bit above the
/// low four set would do.
const NOT_HEX: u8 = 0xF0;

/// The 32 bytes written as exactly 64 lowercase hex digits (the form [`HmacSha256Key::sign_hex`]
/// writes and Vagus sends), or `None` for any other text. One pass with a table; the time
/// depends only on the text, which the caller sent.
#[inline]
pub fn decode_signature_hex(text: &str) -> Option<[u8; 32]> {
    decode_hex32(text.as_bytes())
}

/// The 32 bytes written as exactly 64 lowercase hex digits, or `None` for any other bytes
/// (capitals included, so that the bytes name one text). One pass with a table, no branch per
/// digit.
pub fn decode_hex32(text: &[u8]) -> Option<[u8; 32]> {
    let text: &[u8; 64] = text.try_into().ok()?;
    let mut raw = [0u8; 32];
    let mut bad = 0;
    for (out, pair) in raw.iter_mut().zip(text.chunks_exact(2)) {
        let (high, low) = (HEX_DIGIT[pair[0] as usize], HEX_DIGIT[pair[1] as usize]);
        bad |= high | low;
        *out = high << 4 | low;
    }
    (bad & NOT_HEX == 0).then_some(raw)
}

/// HMAC-SHA256(key = secret bytes, msg) as lowercase hex.
pub fn hmac_sha256_hex(secret: &[u8], msg: &[u8]) -> String {
    HmacSha256Key::new(secret).sign_hex(msg)
}

/// Constant-time check of a hex signature against HMAC-SHA256(secret, msg)
/// ([`HmacSha256Key::verify_hex`] with a key made for this one check).
pub fn verify_hmac_sha256_hex(secret: &[u8], msg: &[u8], signature_hex: &str) -> bool {
    HmacSha256Key::new(secret).verify_hex(msg, signature_hex)
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

    /// Every byte value in every position: only lowercase hex digits decode, to the bytes
    /// the hex crate decodes them to, and only at exactly 64 of them.
    #[test]
    fn signature_hex_is_exactly_64_lowercase_digits() {
        let sig = hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?");
        let mut want = [0u8; 32];
        hex::decode_to_slice(&sig, &mut want).unwrap();
        assert_eq!(decode_signature_hex(&sig), Some(want));
        for at in 0..64 {
            for b in 0..=255u8 {
                let mut text = sig.clone().into_bytes();
                text[at] = b;
                let Ok(text) = String::from_utf8(text) else {
                    continue;
                };
                let lower = matches!(b, b'0'..=b'9' | b'a'..=b'f');
                let mut bytes = [0u8; 32];
                let decoded = lower.then(|| {
                    hex::decode_to_slice(&text, &mut bytes).unwrap();
                    bytes
                });
                assert_eq!(decode_signature_hex(&text), decoded, "{b:#x} at {at}");
            }
        }
        for len in [0, 1, 62, 63, 65, 66, 128] {
            assert_eq!(decode_signature_hex(&"a".repeat(len)), None, "{len}");
        }
        assert_eq!(decode_signature_hex(&format!("{}é", &sig[..62])), None);
    }

    #[test]
    fn a_prepared_key_signs_and_verifies_many_messages_like_the_secret() {
        // RFC 4231 test case 6: a key longer than a block is hashed first.
        let long = [0xaau8; 131];
        let msg: &[u8] = b"Test Using Larger Than Block-Size Key - Hash Key First";
        let key = HmacSha256Key::new(&long);
        let expected = "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54";
        for _ in 0..3 {
            assert_eq!(key.sign_hex(msg), expected);
            assert!(key.verify_hex(msg, expected));
        }
        assert_eq!(hmac_sha256_hex(&long, msg), expected);
        assert!(!key.verify_hex(b"another message", expected));
        assert!(!HmacSha256Key::new(b"Jefe").verify_hex(msg, expected));
        assert_eq!(format!("{key:?}"), "HmacSha256Key(<redacted>)");
    }
}
