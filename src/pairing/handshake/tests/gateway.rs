//! The gateway side: negative vectors, a whole pairing in memory and each bad phase.

use super::*;

#[test]
fn the_gateway_refuses_the_crabstack_handshake_level_negative_vectors() {
    let t = vectors("pairing_transcript.json");
    let neg = vectors("pairing_negative.json");
    let now = transcript_clock(&t);
    let dir = tempfile::tempdir().unwrap();
    let gw = Arc::new(GatewayIdentity::load_or_create(dir.path(), "gw-vectors").unwrap());
    let request = PairRequest {
        component_type: "tool_host".into(),
        component_id: "sidecar-vectors".into(),
        endpoint: "ws://127.0.0.1:47001/v1/pair".into(),
    };
    let negative = |id: &str| {
        neg["vectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["id"] == id)
            .unwrap()["wire_text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let original = |i: usize| t["messages"][i]["wire_text"].as_str().unwrap().to_string();
    let at = |step: &str| GatewayHandshake::resumed(gw.clone(), request.clone(), &t, step);

    // The recorded message passes at that step; the tampered one is refused, and why.
    assert!(at("response").on_message(&original(3), now).is_ok());
    let err = at("response")
        .on_message(&negative("response.wrong_plaintext_resigned"), now)
        .unwrap_err();
    assert!(matches!(err, HandshakeError::ChallengeMismatch), "{err}");

    assert!(at("csr").on_message(&original(4), now).is_ok());
    let err = at("csr")
        .on_message(&negative("csr.self_signature_broken_resigned"), now)
        .unwrap_err();
    assert!(matches!(err, HandshakeError::Certificate(_)), "{err}");

    assert!(matches!(
        at("installed").on_message(&original(6), now),
        Ok(Progress::Done(..))
    ));
    let err = at("installed")
        .on_message(&negative("installed.other_fingerprint_resigned"), now)
        .unwrap_err();
    assert!(matches!(err, HandshakeError::FingerprintMismatch), "{err}");
}

/// Run a whole pairing in memory; `tamper` may rewrite each remote-to-gateway message.
fn pair(
    gw_identity: Arc<GatewayIdentity>,
    request: PairRequest,
    host: Arc<HostIdentity>,
    config: RemoteConfig,
    tls_seen: Option<String>,
    mut tamper: impl FnMut(String) -> String,
) -> Result<(PairedPeer, Installed), HandshakeError> {
    let now = SystemTime::now();
    let (mut gw, init) = GatewayHandshake::start(gw_identity, request, tls_seen, now)?;
    let mut remote = RemoteHandshake::new(config, host, nonces());
    let mut to_remote = vec![init];
    let mut installed = None;
    loop {
        let mut to_gateway = Vec::new();
        for m in to_remote.drain(..) {
            match remote.on_message(&m, now)? {
                Progress::Continue(out) => to_gateway.extend(out),
                Progress::Done(out, i) => {
                    to_gateway.extend(out);
                    installed = Some(i);
                }
            }
        }
        if let Some(i) = installed.take() {
            unreachable!("the tool host finished before the gateway: {i:?}");
        }
        for m in to_gateway {
            match gw.on_message(&tamper(m), now)? {
                Progress::Continue(out) => to_remote.extend(out),
                Progress::Done(out, peer) => {
                    let mut done = None;
                    for m in out {
                        if let Progress::Done(_, i) = remote.on_message(&m, now)? {
                            done = Some(i);
                        }
                    }
                    return Ok((peer, done.expect("tool host completes")));
                }
            }
        }
    }
}

struct Parties {
    _dir: tempfile::TempDir,
    gw: Arc<GatewayIdentity>,
    host: Arc<HostIdentity>,
}

fn parties() -> Parties {
    let dir = tempfile::tempdir().unwrap();
    Parties {
        gw: Arc::new(GatewayIdentity::load_or_create(&dir.path().join("gw"), "gw_test").unwrap()),
        host: Arc::new(HostIdentity::load_or_create(&dir.path().join("host")).unwrap()),
        _dir: dir,
    }
}

fn request() -> PairRequest {
    PairRequest {
        component_type: "tool_host".into(),
        component_id: "memory-east".into(),
        endpoint: "ws://127.0.0.1:7444/v1/pair".into(),
    }
}

fn config(p: &Parties) -> RemoteConfig {
    RemoteConfig {
        component_type: "tool_host".into(),
        component_id: "memory-east".into(),
        gateway_public_key_ed25519: p.gw.public_key_ed25519(),
        endpoint_tls_fingerprint: String::new(),
    }
}

#[test]
fn a_gateway_and_a_tool_host_pair_and_the_certificate_serves_mtls() {
    let p = parties();
    let (peer, installed) = pair(
        p.gw.clone(),
        request(),
        p.host.clone(),
        config(&p),
        None,
        |m| m,
    )
    .unwrap();
    assert_eq!(peer.component_id, "memory-east");
    assert_eq!(peer.public_key_ed25519, p.host.public_key_ed25519());
    assert_eq!(peer.mtls_cert_fingerprint, installed.mtls_cert_fingerprint);
    assert_eq!(installed.chain_pem, std::slice::from_ref(&p.gw.ca_cert_pem));
    // The issued certificate and its key make a working TLS server identity.
    let cert = single_cert(&installed.certificate_pem).unwrap();
    assert_eq!(fingerprint_der(&cert), installed.mtls_cert_fingerprint);
    let key =
        rustls_pki_types::PrivateKeyDer::from_pem_slice(installed.key_pem.as_bytes()).unwrap();
    rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
}

fn resign<M: SignedMessage + WireMessage>(
    mut m: M,
    key: &crate::pairing::wire::SigningIdentity,
) -> String {
    m.sign_with(key).unwrap();
    m.to_wire().unwrap()
}

#[test]
fn the_gateway_refuses_each_bad_phase() {
    let p = parties();
    let host_key = p.host.signing_key();
    let expect = |r: Result<(PairedPeer, Installed), HandshakeError>, what: &str| match r {
        Err(e) => e,
        Ok(_) => panic!("{what}: paired"),
    };

    // Another component than requested.
    let mut other = request();
    other.component_id = "memory-west".into();
    let e = expect(
        pair(p.gw.clone(), other, p.host.clone(), config(&p), None, |m| m),
        "wrong component",
    );
    assert!(matches!(e, HandshakeError::Protocol(_)), "{e}");

    // Over wss://, an identity that does not carry the endpoint's TLS fingerprint.
    let e = expect(
        pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            Some("sha256:00".into()),
            |m| m,
        ),
        "tls fingerprint",
    );
    assert!(matches!(e, HandshakeError::FingerprintMismatch), "{e}");

    // A wrong challenge answer, properly signed.
    let e = expect(
        pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            None,
            |m| match decode_message(&m).unwrap() {
                PairMessage::ChallengeResponse(mut r) => {
                    r.challenge_plaintext = "bm90IHRoZSBjaGFsbGVuZ2U=".into();
                    resign(r, &host_key)
                }
                _ => m,
            },
        ),
        "wrong answer",
    );
    assert!(matches!(e, HandshakeError::ChallengeMismatch), "{e}");

    // A CSR for another identity, properly signed.
    let e = expect(
        pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            None,
            |m| match decode_message(&m).unwrap() {
                PairMessage::CsrRequest(mut r) => {
                    let key = KeyPair::generate().unwrap();
                    let mut params = CertificateParams::new(vec![]).unwrap();
                    params
                        .distinguished_name
                        .push(DnType::CommonName, "gw_test");
                    r.csr_pem = params.serialize_request(&key).unwrap().pem().unwrap();
                    resign(r, &host_key)
                }
                _ => m,
            },
        ),
        "csr identity",
    );
    assert!(matches!(e, HandshakeError::Certificate(_)), "{e}");

    // A CSR whose own signature is broken.
    let e = expect(
        pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            None,
            |m| match decode_message(&m).unwrap() {
                PairMessage::CsrRequest(mut r) => {
                    let mut der = rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(
                        r.csr_pem.as_bytes(),
                    )
                    .unwrap()
                    .as_ref()
                    .to_vec();
                    let last = der.len() - 1;
                    der[last] ^= 1;
                    r.csr_pem = pem_encode("CERTIFICATE REQUEST", &der);
                    resign(r, &host_key)
                }
                _ => m,
            },
        ),
        "csr signature",
    );
    assert!(matches!(e, HandshakeError::Certificate(_)), "{e}");

    // An install confirmation for another certificate, properly signed.
    let e = expect(
        pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            None,
            |m| match decode_message(&m).unwrap() {
                PairMessage::CsrInstalled(mut r) => {
                    r.mtls_cert_fingerprint = format!("sha256:{}", "ab".repeat(32));
                    resign(r, &host_key)
                }
                _ => m,
            },
        ),
        "installed fingerprint",
    );
    assert!(matches!(e, HandshakeError::FingerprintMismatch), "{e}");

    // A message not signed by the key the remote presented.
    let stranger = crate::pairing::wire::SigningIdentity::generate().0;
    let e = expect(
        pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            None,
            |m| match decode_message(&m).unwrap() {
                PairMessage::CsrRequest(r) => resign(r, &stranger),
                _ => m,
            },
        ),
        "foreign signature",
    );
    assert!(matches!(e, HandshakeError::Wire(_)), "{e}");

    // The tool host gives up and says why.
    let e = expect(
        pair(
            p.gw.clone(),
            request(),
            p.host.clone(),
            config(&p),
            None,
            |m| match decode_message(&m).unwrap() {
                PairMessage::CsrRequest(_) => {
                    PairError::handshake_failed("disk full").to_wire().unwrap()
                }
                _ => m,
            },
        ),
        "remote error",
    );
    assert!(matches!(e, HandshakeError::Remote { .. }), "{e}");
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}
