//! The EAT discovery client's JWS, JWK and name parsers: any bytes are judged without a
//! panic; a JWS that parses is RS256 and its signing input is the text before the last dot;
//! a JWK that is taken has at least 2048 bits; every name maps into the catalog alphabet and
//! back, and only names that mapping makes are decoded.

#![no_main]

use carapace::eat::{jws, names};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parsed) = jws::parse(text) {
        assert_eq!(text.matches('.').count(), 2);
        let (input, _) = text.rsplit_once('.').expect("three parts");
        assert_eq!(parsed.signing_input(), input);
    }
    if let Ok(jwk) = serde_json::from_str::<serde_json::Value>(text) {
        if let Ok(key) = jws::RsaKey::from_jwk(&jwk) {
            assert!(key.bits() >= 2048);
        }
    }
    let eat = names::encode(text);
    assert!(eat
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
    if !text.is_empty() {
        assert_eq!(names::decode(&eat).as_deref(), Some(text));
    }
    if let Some(name) = names::decode(text) {
        assert_eq!(names::encode(&name), text, "decode is only the inverse of encode");
    }
});
