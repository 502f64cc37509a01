//! The tool-host side against the crabstack transcript and negative vectors.

use super::*;

#[test]
fn the_transcript_drives_the_tool_host_side_byte_for_byte() {
    let t = vectors("pairing_transcript.json");
    let wire_of = |i: usize| t["messages"][i]["wire_text"].as_str().unwrap().to_string();
    let now = transcript_clock(&t);
    let mut remote = remote_for_transcript(&t, nonces());

    let Progress::Continue(out) = remote.on_message(&wire_of(0), now).unwrap() else {
        panic!("done too early")
    };
    assert_eq!(out, [wire_of(1)], "pair.identity differs from crabstack's");

    let Progress::Continue(out) = remote.on_message(&wire_of(2), now).unwrap() else {
        panic!("done too early")
    };
    assert_eq!(out[0], wire_of(3), "pair.challenge_response differs");
    // The CSR's ECDSA signature is randomized: check what it says, not its bytes.
    let PairMessage::CsrRequest(csr) = decode_message(&out[1]).unwrap() else {
        panic!("not a CSR request")
    };
    let remote_key = t["keys"]["remote_ed25519"]["public_key_b64"]
        .as_str()
        .unwrap();
    csr.verify_with(remote_key).unwrap();
    let parsed = CertificateSigningRequestParams::from_pem(&csr.csr_pem).unwrap();
    assert_eq!(
        parsed
            .params
            .distinguished_name
            .get(&DnType::CommonName)
            .and_then(dn_text)
            .as_deref(),
        Some("sidecar-vectors")
    );

    let Progress::Continue(out) = remote.on_message(&wire_of(5), now).unwrap() else {
        panic!("done too early")
    };
    assert_eq!(out, [wire_of(6)], "pair.csr_installed differs");

    let Progress::Done(out, installed) = remote.on_message(&wire_of(7), now).unwrap() else {
        panic!("not done after pair.complete")
    };
    assert!(out.is_empty());
    assert_eq!(
        installed.mtls_cert_fingerprint,
        t["remote_result"]["mtls_cert_fingerprint"]
            .as_str()
            .unwrap()
    );
    assert_eq!(installed.gateway_id, "gw-vectors");
}

#[test]
fn pairing_and_peer_ids_have_one_documented_form() {
    assert!(is_valid_pairing_id("a3f3553b6b9b3861a24253b5cb7c43a7"));
    for bad in [
        "",
        "../../x",
        "/etc/x",
        "A3F3553B6B9B3861A24253B5CB7C43A7",
        "a3f3",
    ] {
        assert!(!is_valid_pairing_id(bad), "{bad:?}");
    }
    for good in ["gw_home", "gw-vectors", "gw.1"] {
        assert!(is_valid_peer_id(good), "{good:?}");
    }
    let long = "g".repeat(65);
    for bad in [
        "",
        ".",
        "..",
        "../gw",
        "gw home",
        "gw\n",
        "local",
        "anonymous",
        &long,
    ] {
        assert!(!is_valid_peer_id(bad), "{bad:?}");
    }
}

#[test]
fn the_tool_host_refuses_bad_initiations() {
    let t = vectors("pairing_transcript.json");
    let init = t["messages"][0]["wire_text"].as_str().unwrap();
    let now = transcript_clock(&t);
    // Another gateway key configured.
    let mut r = remote_for_transcript(&t, nonces());
    r.config.gateway_public_key_ed25519 = crate::pairing::wire::SigningIdentity::generate()
        .0
        .public_key_b64();
    assert!(matches!(
        r.on_message(init, now),
        Err(HandshakeError::Wire(_))
    ));
    // Stale, either way.
    for skew in [121i64, -121] {
        let at = if skew > 0 {
            now + Duration::from_secs(skew as u64)
        } else {
            now - Duration::from_secs((-skew) as u64)
        };
        let mut r = remote_for_transcript(&t, nonces());
        assert!(matches!(
            r.on_message(init, at),
            Err(HandshakeError::StaleInit(_))
        ));
    }
    // Replayed: the nonce store outlives one handshake.
    let store = nonces();
    let mut r = remote_for_transcript(&t, store.clone());
    r.on_message(init, now).unwrap();
    let mut again = remote_for_transcript(&t, store);
    assert!(matches!(
        again.on_message(init, now),
        Err(HandshakeError::ReplayedInit)
    ));
    // A message out of order.
    let mut r = remote_for_transcript(&t, nonces());
    let challenge = t["messages"][2]["wire_text"].as_str().unwrap();
    assert!(matches!(
        r.on_message(challenge, now),
        Err(HandshakeError::Protocol(_))
    ));
}

#[test]
fn handshake_level_negative_vectors_are_refused() {
    let t = vectors("pairing_transcript.json");
    let neg = vectors("pairing_negative.json");
    let now = transcript_clock(&t);
    let find = |id: &str| {
        neg["vectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["id"] == id)
            .unwrap_or_else(|| panic!("no vector {id}"))["wire_text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let wire_of = |i: usize| t["messages"][i]["wire_text"].as_str().unwrap().to_string();
    // A certificate swapped for another (re-signed by the gateway): the tool host refuses.
    let mut r = remote_for_transcript(&t, nonces());
    r.on_message(&wire_of(0), now).unwrap();
    r.on_message(&wire_of(2), now).unwrap();
    let err = r
        .on_message(&find("issued.cert_swapped_resigned"), now)
        .unwrap_err();
    assert!(
        matches!(
            err,
            HandshakeError::FingerprintMismatch | HandshakeError::Certificate(_)
        ),
        "{err}"
    );
}
