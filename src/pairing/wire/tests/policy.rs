//! Signing round trips, strict verification, the decoding policy and random identifiers.

use super::*;

#[test]
fn sign_and_verify_round_trip_for_every_signed_type() {
    let (gw, gw_seed) = SigningIdentity::generate();
    assert_eq!(
        SigningIdentity::from_seed(&gw_seed)
            .unwrap()
            .public_key_b64(),
        gw.public_key_b64()
    );
    let (rm, _) = SigningIdentity::generate();
    let pid = new_pairing_id();
    let now = GoTime::from_system_time(SystemTime::now())
        .unwrap()
        .to_string();

    let mut init = PairInit::new(
        pid.clone(),
        PairGatewayInfo {
            gateway_id: "gw<1>".into(),
            public_key_ed25519: gw.public_key_b64(),
            nonce: new_nonce(),
            issued_at: now.clone(),
        },
    );
    init.sign_with(&gw).unwrap();
    init.verify_from_gateway(&gw.public_key_b64()).unwrap();
    assert!(matches!(
        init.verify_from_gateway(&rm.public_key_b64()),
        Err(WireError::GatewayKeyMismatch)
    ));
    assert!(matches!(
        init.verify_with(&rm.public_key_b64()),
        Err(WireError::BadSignature)
    ));
    let back = PairInit::from_wire(&init.to_wire().unwrap()).unwrap();
    assert_eq!(back, init);

    let x = new_x25519_secret();
    let mut identity = PairIdentity::new(
        pid.clone(),
        PairRemoteInfo {
            component_type: "tool_host".into(),
            component_id: "a\u{2028}é&".into(),
            public_key_ed25519: rm.public_key_b64(),
            public_key_x25519: x25519_public_b64(&x),
            mtls_cert_fingerprint: String::new(),
        },
    );
    identity.sign_with(&rm).unwrap();
    identity.verify_self_signed().unwrap();
    assert_eq!(
        PairIdentity::from_wire(&identity.to_wire().unwrap()).unwrap(),
        identity
    );

    let mut resp =
        PairChallengeResponse::new(pid.clone(), new_challenge_id(), new_challenge_plaintext());
    resp.sign_with(&rm).unwrap();
    resp.verify_with(&rm.public_key_b64()).unwrap();
    let mut csr = PairCsrRequest::new(
        pid.clone(),
        "-----BEGIN CERTIFICATE REQUEST-----\nAA==\n-----END CERTIFICATE REQUEST-----\n",
    );
    csr.sign_with(&rm).unwrap();
    csr.verify_with(&rm.public_key_b64()).unwrap();
    let mut issued = PairCsrIssued::new(
        pid.clone(),
        "pem",
        Vec::new(),
        "1f",
        fingerprint_der(b"der"),
        "2026-01-02T05:00:00+02:00",
        "2027-01-02T03:00:00Z",
    );
    issued.sign_with(&gw).unwrap();
    issued.verify_with(&gw.public_key_b64()).unwrap();
    let signed = String::from_utf8(issued.signed_bytes().unwrap()).unwrap();
    assert!(!signed.contains("certificate_chain_pem"));
    assert!(signed.contains("\"not_before\":\"2026-01-02T03:00:00Z\""));
    let wire = issued.to_wire().unwrap();
    assert!(wire.contains("\"not_before\":\"2026-01-02T05:00:00+02:00\""));
    assert_eq!(PairCsrIssued::from_wire(&wire).unwrap(), issued);
    let mut installed = PairCsrInstalled::new(pid.clone(), issued.mtls_cert_fingerprint.clone());
    installed.sign_with(&rm).unwrap();
    installed.verify_with(&rm.public_key_b64()).unwrap();
    installed.mtls_cert_fingerprint = installed.mtls_cert_fingerprint.to_ascii_uppercase();
    assert!(matches!(
        installed.verify_with(&rm.public_key_b64()),
        Err(WireError::BadSignature)
    ));

    // Signing refuses a wrong header.
    let mut wrong = PairCsrInstalled {
        version: "v2".into(),
        ..installed
    };
    assert!(matches!(wrong.sign_with(&rm), Err(WireError::WrongVersion(v)) if v == "v2"));
}

#[test]
fn verify_is_strict_about_encodings() {
    let (id, _) = SigningIdentity::generate();
    let key = id.public_key_b64();
    let sig = id.sign(b"msg");
    verify(&key, b"msg", &sig).unwrap();
    assert!(matches!(
        verify(&key, b"msh", &sig),
        Err(WireError::BadSignature)
    ));
    assert!(matches!(
        verify(&key, b"msg", ""),
        Err(WireError::MissingSignature)
    ));
    assert!(matches!(
        verify(&key, b"msg", "!!"),
        Err(WireError::BadBase64 {
            field: "sig_ed25519"
        })
    ));
    assert!(matches!(
        verify(&key, b"msg", &BASE64.encode([0u8; 63])),
        Err(WireError::BadSignatureLength(63))
    ));
    assert!(matches!(
        verify(&BASE64.encode([0u8; 31]), b"msg", &sig),
        Err(WireError::BadKeyLength {
            expected: 32,
            actual: 31,
            ..
        })
    ));
    assert!(matches!(
        verify("", b"msg", &sig),
        Err(WireError::BadKeyLength { actual: 0, .. })
    ));
    // Missing padding, non-zero trailing bits, URL alphabet, embedded newline.
    assert!(matches!(
        verify(key.trim_end_matches('='), b"msg", &sig),
        Err(WireError::BadBase64 { .. })
    ));
    let url = sig.replace('+', "-").replace('/', "_");
    if url != sig {
        assert!(matches!(
            verify(&key, b"msg", &url),
            Err(WireError::BadBase64 { .. })
        ));
    }
    let wrapped = format!("{}\n{}", &sig[..40], &sig[40..]);
    assert!(matches!(
        verify(&key, b"msg", &wrapped),
        Err(WireError::BadBase64 { .. })
    ));
    // A public key with the last char's unused bits set is not canonical.
    let last = key.as_bytes()[42];
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let pos = alphabet.iter().position(|c| *c == last).unwrap();
    let mut noncanon = key.clone().into_bytes();
    noncanon[42] = alphabet[pos ^ 1];
    let noncanon = String::from_utf8(noncanon).unwrap();
    assert!(matches!(
        verify(&noncanon, b"msg", &sig),
        Err(WireError::BadBase64 { .. })
    ));
    assert!(format!("{id:?}").contains(&key));
}

#[test]
fn decoding_policy() {
    // Unknown fields, reordering, trailing newline: accepted.
    let m = PairComplete::from_wire("{\"status\":\"ok\",\"x\":[1,{}],\"pairing_id\":\"p\",\"version\":\"v1\",\"type\":\"pair.complete\"}\n").unwrap();
    assert_eq!(m, PairComplete::ok("p"));
    // Missing fields are Go zero values.
    let m = PairCsrInstalled::from_wire("{\"type\":\"pair.csr_installed\",\"version\":\"v1\"}")
        .unwrap();
    assert_eq!(m.pairing_id, "");
    assert!(matches!(
        m.verify_with(&BASE64.encode([1u8; 32])),
        Err(WireError::MissingSignature)
    ));
    // Duplicate keys, null strings, wrong JSON types, trailing content: refused.
    assert!(
        PairComplete::from_wire("{\"type\":\"pair.complete\",\"type\":\"pair.complete\"}").is_err()
    );
    assert!(PairComplete::from_wire("{\"type\":null}").is_err());
    assert!(PairComplete::from_wire("{\"type\":1}").is_err());
    assert!(PairComplete::from_wire("{} {}").is_err());
    assert!(PairComplete::from_wire("[]").is_err());
    assert!(PairComplete::from_wire("[\"pair.complete\",\"v1\",\"p\",\"ok\"]").is_err());
    assert!(message_type("[\"pair.complete\"]").is_err());
    let array_gateway = "{\"type\":\"pair.init\",\"version\":\"v1\",\"gateway\":[\"g\",\"k\",\"n\",\"2026-01-02T03:04:05Z\"]}";
    assert!(PairInit::from_wire(array_gateway).is_err());
    assert!(decode_message(array_gateway).is_err());
    // Header checks.
    let m = PairComplete {
        msg_type: "pair.Complete".into(),
        ..PairComplete::ok("p")
    };
    assert!(matches!(
        m.check_header(),
        Err(WireError::WrongType {
            expected: "pair.complete",
            ..
        })
    ));
    // Type peeking and dispatch.
    assert_eq!(
        message_type("{\"a\":1,\"type\":\"pair.error\"}").unwrap(),
        "pair.error"
    );
    assert!(matches!(
        message_type("{\"a\":1}"),
        Err(WireError::MissingType)
    ));
    assert!(matches!(
        message_type("{\"type\":null}"),
        Err(WireError::MissingType)
    ));
    assert!(matches!(
        message_type("{\"type\":\"\"}"),
        Err(WireError::MissingType)
    ));
    assert!(matches!(message_type("not json"), Err(WireError::Json(_))));
    assert!(
        matches!(decode_message("{\"type\":\"pair.Init\"}"), Err(WireError::UnknownType(t)) if t == "pair.Init")
    );
    let err = PairError::handshake_failed("verify pair.init signature: <bad> & \"worse\"");
    let wire = err.to_wire().unwrap();
    assert_eq!(
        wire,
        "{\"type\":\"pair.error\",\"version\":\"v1\",\"pairing_id\":\"\",\"code\":\"HANDSHAKE_FAILED\",\"message\":\"verify pair.init signature: \\u003cbad\\u003e \\u0026 \\\"worse\\\"\"}\n"
    );
    assert_eq!(decode_message(&wire).unwrap(), PairMessage::Error(err));
    // An empty aad is omitted on the wire; the chain likewise.
    let c = PairChallenge::new("p", "c", "ct", "");
    assert_eq!(
        c.to_wire().unwrap(),
        "{\"type\":\"pair.challenge\",\"version\":\"v1\",\"pairing_id\":\"p\",\"challenge_id\":\"c\",\"ciphertext\":\"ct\"}\n"
    );
    assert!(!serde_json::to_string(&c).unwrap().contains("aad"));
}

#[test]
fn random_helpers_have_the_wire_formats() {
    let id = new_pairing_id();
    assert_eq!(id.len(), 32);
    assert!(id
        .bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
    assert_ne!(id, new_pairing_id());
    assert_eq!(new_challenge_id().len(), 32);
    let nonce = new_nonce();
    assert_eq!(nonce.len(), 32);
    assert_eq!(BASE64.decode(&nonce).unwrap().len(), 24);
    let p = new_challenge_plaintext();
    assert_eq!(p.len(), 44);
    assert!(p.ends_with('=') && !p.ends_with("=="));
    assert_eq!(BASE64.decode(&p).unwrap().len(), 32);
}
