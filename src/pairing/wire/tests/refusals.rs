//! Fingerprint vectors, negative vectors and accepted variants.

use super::*;

#[test]
fn fingerprints_match_vectors() {
    let t = transcript();
    for f in t["fingerprints"].as_array().unwrap() {
        let der = b64(s(f, "certificate_der_b64"));
        let fp = fingerprint_der(&der);
        assert_eq!(fp, s(f, "fingerprint"));
        assert_eq!(fp, format!("sha256:{}", s(f, "sha256_hex")));
        let upper = fp.to_ascii_uppercase();
        assert!(upper.starts_with("SHA256:"));
        assert!(fingerprints_match(&fp, &upper));
        assert!(fingerprints_match(&format!("  {upper}\n"), &fp));
        let mut other = fp.clone();
        let last = other.pop().unwrap();
        other.push(if last == '0' { '1' } else { '0' });
        assert!(!fingerprints_match(&fp, &other));
        assert!(!fingerprints_match(&fp, ""));
    }
    // The issued certificate in pair.csr_issued matches its signed fingerprint and
    // the one pair.csr_installed confirms; the chain entry is the CA.
    let messages = t["messages"].as_array().unwrap();
    let issued = PairCsrIssued::from_wire(s(&messages[5], "wire_text")).unwrap();
    let installed = PairCsrInstalled::from_wire(s(&messages[6], "wire_text")).unwrap();
    let fp = fingerprint_der(&pem_to_der(&issued.certificate_pem));
    assert_eq!(fp, issued.mtls_cert_fingerprint);
    assert!(fingerprints_match(&installed.mtls_cert_fingerprint, &fp));
    assert_eq!(
        fingerprint_der(&pem_to_der(&issued.certificate_chain_pem[0])),
        s(&t["keys"]["pairing_ca"], "fingerprint")
    );
    assert_eq!(
        s(&t["fingerprints"][0], "serial_number_hex_as_sent"),
        issued.serial_number
    );
    // Go EqualFold would also fold U+017F (ſ) to 's'; ASCII folding refuses it.
    assert!(!fingerprints_match(&fp.replacen('s', "\u{17f}", 1), &fp));
}

/// What this module's refusal of one negative vector looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    BadSignature,
    MissingSignature,
    WrongType,
    WrongVersion,
    GatewayKeyMismatch,
    AadMismatch,
    BadAad,
    TooShort,
    Decryption,
}

fn classify(e: &WireError) -> Refusal {
    match e {
        WireError::BadSignature => Refusal::BadSignature,
        WireError::MissingSignature => Refusal::MissingSignature,
        WireError::WrongType { .. } => Refusal::WrongType,
        WireError::WrongVersion(_) => Refusal::WrongVersion,
        WireError::GatewayKeyMismatch => Refusal::GatewayKeyMismatch,
        WireError::AadMismatch => Refusal::AadMismatch,
        WireError::BadAad(_) => Refusal::BadAad,
        WireError::CiphertextTooShort => Refusal::TooShort,
        WireError::DecryptionFailed => Refusal::Decryption,
        other => panic!("unexpected error kind {other:?}"),
    }
}

/// The refusal expected here for each negative vector id (mirrors the Go error text).
fn expected_refusal(id: &str) -> Refusal {
    match id {
        "init.sig_empty" => Refusal::MissingSignature,
        "init.type_case" => Refusal::WrongType,
        "init.version" => Refusal::WrongVersion,
        "init.foreign_key_resigned" => Refusal::GatewayKeyMismatch,
        "challenge.truncated" => Refusal::TooShort,
        "challenge.aad_pairing_id" | "challenge.challenge_id" => Refusal::AadMismatch,
        "challenge.aad_missing" => Refusal::BadAad,
        "challenge.tag_bitflip"
        | "challenge.nonce_bitflip"
        | "challenge.aad_whitespace"
        | "challenge.aad_ephemeral_swapped" => Refusal::Decryption,
        _ => Refusal::BadSignature,
    }
}

/// Runs the check the receiving side of `v` performs at the wire level. Also checks
/// that the re-marshalled signed bytes equal what Go recomputed for the vector.
fn wire_check(
    v: &Value,
    gateway_key: &str,
    remote_key: &str,
    remote_x: &StaticSecret,
) -> Result<(), WireError> {
    fn signed<M: SignedMessage>(v: &Value, key: &str) -> Result<(), WireError> {
        let msg = M::from_wire(s(v, "wire_text")).expect("tampered message still decodes");
        if let Some(expected) = v.get("recomputed_signed_bytes_b64").and_then(Value::as_str) {
            assert_eq!(
                String::from_utf8(msg.signed_bytes().unwrap()).unwrap(),
                String::from_utf8(b64(expected)).unwrap(),
                "recomputed signed bytes of {}",
                s(v, "id")
            );
        }
        msg.verify_with(key)
    }
    match s(v, "message_type") {
        TYPE_INIT => {
            // Remote: configured gateway key (also catches a swapped carried key).
            let r = signed::<PairInit>(v, gateway_key);
            let msg = PairInit::from_wire(s(v, "wire_text")).unwrap();
            let full = msg.verify_from_gateway(gateway_key);
            assert_eq!(r.is_ok(), full.is_ok(), "{}", s(v, "id"));
            full
        }
        TYPE_CSR_ISSUED => signed::<PairCsrIssued>(v, gateway_key),
        TYPE_IDENTITY => {
            // Gateway: verified with the key the message carries.
            let msg = PairIdentity::from_wire(s(v, "wire_text")).unwrap();
            let r = signed::<PairIdentity>(v, &msg.remote.public_key_ed25519);
            assert_eq!(r.is_ok(), msg.verify_self_signed().is_ok());
            r
        }
        TYPE_CHALLENGE_RESPONSE => signed::<PairChallengeResponse>(v, remote_key),
        TYPE_CSR_REQUEST => signed::<PairCsrRequest>(v, remote_key),
        TYPE_CSR_INSTALLED => signed::<PairCsrInstalled>(v, remote_key),
        TYPE_CHALLENGE => {
            let msg = PairChallenge::from_wire(s(v, "wire_text")).unwrap();
            open_challenge(remote_x, &msg).map(|_| ())
        }
        other => panic!("unexpected message type {other}"),
    }
}

#[test]
fn negative_vectors_are_refused_or_left_to_the_handshake() {
    let n = load("pairing_negative.json");
    let gateway_key = s(&n, "gateway_public_key_b64");
    let remote_key = s(&n, "remote_public_key_b64");
    let remote_x = StaticSecret::from(seed(s(&n, "remote_x25519_private_hex")));
    let vectors = n["vectors"].as_array().unwrap();
    assert_eq!(vectors.len(), 41);
    let mut refused = Vec::new();
    let mut left = Vec::new();
    for v in vectors {
        let id = s(v, "id");
        assert_eq!(s(v, "expect"), "reject");
        let result = wire_check(v, gateway_key, remote_key, &remote_x);
        if HANDSHAKE_CHECKED.contains(&id) {
            // Validly signed: the wire layer must accept it so the handshake decides.
            result.unwrap_or_else(|e| {
                panic!("{id}: wire layer refused a handshake-level vector: {e}")
            });
            left.push(id);
        } else {
            let err = result.expect_err(id);
            assert_eq!(classify(&err), expected_refusal(id), "{id}: {err}");
            refused.push(id);
        }
    }
    assert_eq!(refused.len(), 37, "{refused:?}");
    assert_eq!(left.len(), HANDSHAKE_CHECKED.len());
    for id in HANDSHAKE_CHECKED {
        assert!(left.contains(id), "{id} is not a negative vector");
    }
    assert_eq!(refused.len() + left.len(), vectors.len());
}

/// `accepted_variants` this module refuses (fail closed), with the reason.
const REFUSED_VARIANTS: &[(&str, &str)] = &[(
    "init.key_case_insensitive",
    "keys match case-sensitively: PAIRING_ID is ignored, pairing_id stays empty, signature fails",
)];

#[test]
fn accepted_variants_verify_except_documented_refusals() {
    let n = load("pairing_negative.json");
    let gateway_key = s(&n, "gateway_public_key_b64");
    let remote_key = s(&n, "remote_public_key_b64");
    let remote_x = StaticSecret::from(seed(s(&n, "remote_x25519_private_hex")));
    let variants = n["accepted_variants"]["vectors"].as_array().unwrap();
    assert_eq!(variants.len(), 8);
    let mut accepted = 0;
    for v in variants {
        let id = s(v, "id");
        assert_eq!(s(v, "expect"), "accept");
        if REFUSED_VARIANTS.iter().any(|(r, _)| *r == id) {
            let msg = PairInit::from_wire(s(v, "wire_text")).unwrap();
            assert_eq!(msg.pairing_id, "");
            assert!(matches!(
                msg.verify_from_gateway(gateway_key),
                Err(WireError::BadSignature)
            ));
            continue;
        }
        wire_check(v, gateway_key, remote_key, &remote_x).unwrap_or_else(|e| panic!("{id}: {e}"));
        accepted += 1;
    }
    assert_eq!(accepted, 7);

    // Specific consequences.
    let by_id = |id: &str| variants.iter().find(|v| s(v, "id") == id).unwrap();
    let issued = PairCsrIssued::from_wire(s(
        by_id("issued.fingerprint_uppercase_resigned"),
        "wire_text",
    ))
    .unwrap();
    assert!(fingerprints_match(
        &issued.mtls_cert_fingerprint,
        &fingerprint_der(&pem_to_der(&issued.certificate_pem))
    ));
    let installed = PairCsrInstalled::from_wire(s(
        by_id("installed.fingerprint_uppercase_resigned"),
        "wire_text",
    ))
    .unwrap();
    assert!(fingerprints_match(
        &installed.mtls_cert_fingerprint,
        &issued.mtls_cert_fingerprint
    ));
    // Wire re-encoding of the offset form keeps the offset; the signature uses UTC.
    let offset =
        PairCsrIssued::from_wire(s(by_id("issued.not_before_offset_form"), "wire_text")).unwrap();
    assert!(offset
        .to_wire()
        .unwrap()
        .contains("\"not_before\":\"2026-01-02T04:59:05+02:00\""));
    // Re-signing an untrimmed issued_at gives the transcript's signature.
    let t = transcript();
    let mut untrimmed =
        PairInit::from_wire(s(by_id("init.issued_at_untrimmed"), "wire_text")).unwrap();
    assert_eq!(
        untrimmed.gateway.issued_at,
        "2026-01-02T03:04:05.123456700Z"
    );
    let expected_sig = untrimmed.sig_ed25519.clone();
    untrimmed.sign_with(&gateway_identity(&t)).unwrap();
    assert_eq!(untrimmed.sig_ed25519, expected_sig);
    // The self-signed other key verifies with its own key only.
    let other =
        PairIdentity::from_wire(s(by_id("identity.self_signed_other_key"), "wire_text")).unwrap();
    other.verify_self_signed().unwrap();
    assert!(matches!(
        other.verify_with(remote_key),
        Err(WireError::BadSignature)
    ));
}
