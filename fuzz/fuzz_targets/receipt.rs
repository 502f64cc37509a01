//! The receipt decoder: any bytes are judged without a panic; a value that decodes is in
//! RFC 8785 form, re-encodes to the same payload, and verifies only with the key that
//! signed it.

#![no_main]

use carapace::pairing::wire::SigningIdentity;
use carapace::receipts::{decode, verify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(encoded) = decode(data) else {
        return;
    };
    assert_eq!(encoded.receipt.canonical().as_bytes(), encoded.payload.as_slice());
    let key = SigningIdentity::from_seed(&[1; 32]).expect("seed");
    let signed = encoded.receipt.encode(&key);
    assert_eq!(verify(signed.as_bytes(), &key.public_key_b64()), Ok(encoded.receipt.clone()));
    let other = SigningIdentity::from_seed(&[2; 32]).expect("seed");
    assert!(verify(signed.as_bytes(), &other.public_key_b64()).is_err());
});
