//! The receipt decoder: any bytes are judged without a panic, a `v2` inclusion proof
//! included; a value that decodes is in RFC 8785 form, re-encodes to the same payload, and
//! verifies only with the key that signed it, alone or in a batch.

#![no_main]

use carapace::pairing::wire::SigningIdentity;
use carapace::receipts::{batch, decode, verify};
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
    // Whatever proof the input carries is followed to a root (or refused) without a panic.
    let _ = verify(data, &key.public_key_b64());
    if encoded.proof.is_some() {
        let batch = batch::sign_batch(&key, &[encoded.receipt.canonical(), "{}".into()]);
        assert!(verify(batch[0].as_bytes(), &other.public_key_b64()).is_err());
        assert_eq!(verify(batch[0].as_bytes(), &key.public_key_b64()), Ok(encoded.receipt));
    }
});
