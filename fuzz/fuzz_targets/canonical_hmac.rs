//! Strict JSON parsing, the Vagus-compatible canonical form and the HMAC check.
#![no_main]

use libfuzzer_sys::fuzz_target;

use carapace_filters::canonical::{
    canonical_string, hmac_sha256_hex, parse_strict, verify_hmac_sha256_hex,
};

const SECRET: &[u8] = b"demo-secret";

fuzz_target!(|body: &[u8]| {
    // Whatever the body, a signature taken from it is checked without panicking.
    let claimed = String::from_utf8_lossy(&body[..body.len().min(64)]);
    let _ = verify_hmac_sha256_hex(SECRET, body, &claimed);

    let Ok(value) = parse_strict(body) else {
        return;
    };
    let Ok(canonical) = canonical_string(&value) else {
        return;
    };
    // The canonical string is strict JSON again, and canonicalizing it changes nothing.
    let reparsed = parse_strict(canonical.as_bytes())
        .unwrap_or_else(|e| panic!("canonical form {canonical:?} does not reparse: {e}"));
    let again = canonical_string(&reparsed)
        .unwrap_or_else(|e| panic!("canonical form {canonical:?} does not canonicalize: {e}"));
    assert_eq!(canonical, again, "canonicalization is not idempotent");

    // The MAC of the canonical string verifies; a different one does not.
    let mac = hmac_sha256_hex(SECRET, canonical.as_bytes());
    assert!(verify_hmac_sha256_hex(SECRET, canonical.as_bytes(), &mac));
    let flipped: String = mac
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i == 0 {
                if c == '0' {
                    '1'
                } else {
                    '0'
                }
            } else {
                c
            }
        })
        .collect();
    assert!(!verify_hmac_sha256_hex(
        SECRET,
        canonical.as_bytes(),
        &flipped
    ));
    if mac.bytes().any(|b| b.is_ascii_alphabetic()) {
        // Only lowercase hex is a signature.
        let upper = mac.to_ascii_uppercase();
        assert!(!verify_hmac_sha256_hex(
            SECRET,
            canonical.as_bytes(),
            &upper
        ));
    }
});
