//! The crabstack transcript: messages, keys and the challenge, byte for byte.

use super::*;

#[test]
fn transcript_messages_decode_reencode_and_verify() {
    let t = transcript();
    let gw = gateway_identity(&t);
    let rm = remote_identity(&t);
    let messages = t["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 8);
    let mut signed = 0;
    for m in messages {
        let wire = s(m, "wire_text");
        assert_eq!(b64(s(m, "wire_b64")), wire.as_bytes());
        let ty = s(m, "type");
        assert_eq!(message_type(wire).unwrap(), ty);
        let decoded = decode_message(wire).unwrap();
        if let Some(sig) = m.get("signature") {
            signed += 1;
            let key = s(sig, "public_key_ed25519");
            let signer = if s(sig, "signer") == "gateway" {
                &gw
            } else {
                &rm
            };
            assert_eq!(signer.public_key_b64(), key);
            let sb = s(sig, "signed_bytes_b64");
            assert_eq!(b64(sb), s(sig, "signed_bytes_text").as_bytes());
            let got_sig = match ty {
                TYPE_INIT => check_signed::<PairInit>(wire, sb, key, Some(signer)).sig_ed25519,
                TYPE_IDENTITY => {
                    let m = check_signed::<PairIdentity>(wire, sb, key, Some(signer));
                    m.verify_self_signed().unwrap();
                    m.sig_ed25519
                }
                TYPE_CHALLENGE_RESPONSE => {
                    check_signed::<PairChallengeResponse>(wire, sb, key, Some(signer)).sig_ed25519
                }
                TYPE_CSR_REQUEST => {
                    check_signed::<PairCsrRequest>(wire, sb, key, Some(signer)).sig_ed25519
                }
                TYPE_CSR_ISSUED => {
                    check_signed::<PairCsrIssued>(wire, sb, key, Some(signer)).sig_ed25519
                }
                TYPE_CSR_INSTALLED => {
                    check_signed::<PairCsrInstalled>(wire, sb, key, Some(signer)).sig_ed25519
                }
                other => panic!("unexpected signed type {other}"),
            };
            assert_eq!(got_sig, s(sig, "sig_ed25519"));
            verify(key, &b64(sb), s(sig, "sig_ed25519")).unwrap();
        } else {
            match decoded {
                PairMessage::Challenge(c) => {
                    c.check_header().unwrap();
                    assert_eq!(c.to_wire().unwrap(), wire);
                }
                PairMessage::Complete(c) => {
                    c.check_header().unwrap();
                    assert_eq!(c.status, STATUS_OK);
                    assert_eq!(c.to_wire().unwrap(), wire);
                    assert_eq!(PairComplete::ok(c.pairing_id.clone()), c);
                }
                other => panic!("unexpected unsigned message {other:?}"),
            }
        }
    }
    assert_eq!(signed, 6);
    let init = PairInit::from_wire(s(&messages[0], "wire_text")).unwrap();
    init.verify_from_gateway(&gw.public_key_b64()).unwrap();
}

#[test]
fn keys_derive_from_seeds() {
    let t = transcript();
    let k = &t["keys"];
    assert_eq!(
        gateway_identity(&t).public_key_b64(),
        s(&k["gateway_ed25519"], "public_key_b64")
    );
    assert_eq!(
        remote_identity(&t).public_key_b64(),
        s(&k["remote_ed25519"], "public_key_b64")
    );
    // Go's 64-byte private key is seed || public key.
    let go_priv = b64(s(&k["gateway_ed25519"], "private_key_go_64byte_b64"));
    assert_eq!(&go_priv[32..], gateway_identity(&t).public_key_bytes());
    assert_eq!(
        x25519_public_b64(&remote_x25519(&t)),
        s(&k["remote_x25519"], "public_key_b64")
    );
    let eph = StaticSecret::from(seed(s(&k["ephemeral_x25519"], "private_key_hex")));
    assert_eq!(
        x25519_public_b64(&eph),
        s(&k["ephemeral_x25519"], "public_key_b64")
    );
}

#[test]
fn challenge_opens_with_remote_secret() {
    let t = transcript();
    let c = &t["challenge_encryption"];
    let wire = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| s(m, "type") == TYPE_CHALLENGE)
        .map(|m| s(m, "wire_text"))
        .unwrap();
    let msg = PairChallenge::from_wire(wire).unwrap();
    assert_eq!(msg.ciphertext, s(c, "wire_ciphertext_b64"));
    assert_eq!(msg.aad, s(c, "aad_b64"));
    assert_eq!(b64(&msg.aad), s(c, "aad_text").as_bytes());
    let plaintext = open_challenge(&remote_x25519(&t), &msg).unwrap();
    assert_eq!(plaintext, s(c, "plaintext_text").as_bytes());
    // The response echoes it.
    let resp = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| s(m, "type") == TYPE_CHALLENGE_RESPONSE)
        .map(|m| PairChallengeResponse::from_wire(s(m, "wire_text")).unwrap())
        .unwrap();
    assert_eq!(resp.challenge_plaintext.as_bytes(), plaintext.as_slice());
    assert_eq!(resp.challenge_id, msg.challenge_id);
}

#[test]
fn challenge_seal_is_reproducible_and_intermediates_match() {
    let t = transcript();
    let c = &t["challenge_encryption"];
    let aad_text = s(c, "aad_text");
    let meta: ChallengeAad = serde_json::from_str(aad_text).unwrap();
    let eph = seed(s(c, "ephemeral_private_hex"));
    let nonce: [u8; 12] = hex::decode(s(c, "nonce_hex")).unwrap().try_into().unwrap();
    let (ciphertext, aad) = seal_challenge_with(
        s(c, "remote_x25519_public_b64"),
        &meta.pairing_id,
        &meta.challenge_id,
        s(c, "plaintext_text").as_bytes(),
        eph,
        nonce,
    )
    .unwrap();
    assert_eq!(aad, s(c, "aad_b64"));
    assert_eq!(ciphertext, s(c, "wire_ciphertext_b64"));
    let raw = b64(&ciphertext);
    assert_eq!(hex::encode(&raw[..12]), s(c, "nonce_hex"));
    assert_eq!(
        hex::encode(&raw[12..]),
        format!("{}{}", s(c, "gcm_ciphertext_hex"), s(c, "gcm_tag_hex"))
    );
    assert_eq!(
        challenge_aad_bytes(
            &meta.pairing_id,
            &meta.challenge_id,
            s(c, "ephemeral_public_b64")
        ),
        aad_text.as_bytes()
    );

    // Shared secret from both sides and the derived key.
    let remote_pub = decode_key32("x", s(c, "remote_x25519_public_b64")).unwrap();
    let eph_pub = decode_key32("x", s(c, "ephemeral_public_b64")).unwrap();
    let from_gateway = x25519_agree(&StaticSecret::from(eph), remote_pub).unwrap();
    let from_remote = x25519_agree(
        &StaticSecret::from(seed(s(c, "remote_x25519_private_hex"))),
        eph_pub,
    )
    .unwrap();
    assert_eq!(
        hex::encode(from_gateway.as_bytes()),
        s(c, "shared_secret_hex")
    );
    assert_eq!(from_remote.as_bytes(), from_gateway.as_bytes());
    assert_eq!(
        hex::encode(derive_challenge_key(&from_remote, aad_text.as_bytes())),
        s(c, "derived_key_hex")
    );

    // The challenge message of the transcript is exactly what the gateway built.
    let built = PairChallenge::new(meta.pairing_id, meta.challenge_id, ciphertext, aad);
    let wire = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| s(m, "type") == TYPE_CHALLENGE)
        .map(|m| s(m, "wire_text"))
        .unwrap();
    assert_eq!(built.to_wire().unwrap(), wire);
}

#[test]
fn challenge_random_round_trip_and_low_order_key() {
    let secret = new_x25519_secret();
    let public = x25519_public_b64(&secret);
    let pairing_id = new_pairing_id();
    let challenge_id = new_challenge_id();
    let plaintext = new_challenge_plaintext();
    let (ct, aad) =
        seal_challenge(&public, &pairing_id, &challenge_id, plaintext.as_bytes()).unwrap();
    let msg = PairChallenge::new(pairing_id.clone(), challenge_id.clone(), ct, aad);
    assert_eq!(open_challenge(&secret, &msg).unwrap(), plaintext.as_bytes());
    // Another secret cannot open it.
    assert!(matches!(
        open_challenge(&new_x25519_secret(), &msg),
        Err(WireError::DecryptionFailed)
    ));
    // Sealing to, or receiving from, the all-zero (low-order) point is refused.
    let zero = BASE64.encode([0u8; 32]);
    assert!(matches!(
        seal_challenge(&zero, &pairing_id, &challenge_id, b"x"),
        Err(WireError::LowOrderKey)
    ));
    let aad = challenge_aad_bytes(&pairing_id, &challenge_id, &zero);
    let bad = PairChallenge::new(
        pairing_id,
        challenge_id,
        BASE64.encode([0u8; 40]),
        BASE64.encode(aad),
    );
    assert!(matches!(
        open_challenge(&secret, &bad),
        Err(WireError::LowOrderKey)
    ));
    // A wrong key length in the AAD.
    let aad = challenge_aad_bytes(
        &bad.pairing_id,
        &bad.challenge_id,
        &BASE64.encode([1u8; 31]),
    );
    let bad = PairChallenge {
        aad: BASE64.encode(aad),
        ..bad
    };
    assert!(matches!(
        open_challenge(&secret, &bad),
        Err(WireError::BadKeyLength {
            expected: 32,
            actual: 31,
            ..
        })
    ));
    // Wrong type is refused before decrypting.
    let wrong = PairChallenge {
        msg_type: "pair.Challenge".into(),
        ..msg
    };
    assert!(matches!(
        open_challenge(&secret, &wrong),
        Err(WireError::WrongType { .. })
    ));
}
