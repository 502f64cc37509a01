//! The pairing handshake through the gateway's admin socket: the tool host installs the
//! certificate the gateway issued and the gateway's CA, and from then on only the paired
//! gateway's certificate gets through; what the admin socket refuses; a pairing cut off half
//! way.

use std::path::PathBuf;
use std::sync::Arc;

use carapace::client::{tls_config, Client, Transport};
use carapace::pairing::identity::GatewayIdentity;
use carapace::pki::Issued;
use carapace::server::Running;
use http::{Method, StatusCode};
use serde_json::json;
use x509_parser::prelude::FromDer;

use crate::common::{call, code, wait_until, write_peers, Env};
use crate::{
    admin, gateway_yaml, host_pairing, installed_certificate, issued, query, start_gateway,
};

/// A tool host paired by a gateway (`gw_home`, no outbound role) through the gateway's admin
/// socket, having refused the gateway's client before.
struct PairedHost {
    gw: Running,
    gw_dir: PathBuf,
    identity: Arc<GatewayIdentity>,
    host: Running,
    /// What the admin socket answered to the pairing.
    reported: serde_json::Value,
}

impl PairedHost {
    async fn new(env: &Env) -> PairedHost {
        // The tool host starts with nothing paired.
        write_peers(&env.path().join("peers.json"), &[]);
        let gw_dir = env.path().join("gw");
        let gw = start_gateway(&gw_dir, &gateway_yaml(&gw_dir, env.app_addr, None, "")).await;
        let identity = gw.shared.gateway.clone().expect("gateway role");
        // The tool host, configured with the gateway's public key.
        let host = env
            .start(&env.tools_yaml(&host_pairing(&identity.public_key_ed25519())))
            .await;
        let pair_addr = host.pairing_address.expect("pairing endpoint");
        // Before pairing: PAIRING_REQUIRED.
        let before = env
            .gateway(&host)
            .post_json("/v1/tools/call", &[], &query())
            .await
            .unwrap();
        assert_eq!(code(&before), "PAIRING_REQUIRED");
        // The operator pairs it: `carapace pair tool ws://... memory-east` does exactly this.
        let (status, reported) = carapace::admin::request(
            &gw.admin_socket,
            Method::POST,
            "/v1/pairings",
            Some(json!({
                "component_type": "tool",
                "component_id": "memory-east",
                "endpoint": format!("ws://{pair_addr}/v1/pair"),
            })),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::OK, "{reported}");
        PairedHost {
            gw,
            gw_dir,
            identity,
            host,
            reported,
        }
    }

    /// The fingerprint of the certificate the gateway issued the tool host, as reported.
    fn fingerprint(&self) -> &str {
        self.reported["peer"]["mtls_cert_fingerprint"]
            .as_str()
            .unwrap()
    }

    /// The gateway's peer file.
    fn gateway_peers(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.gw_dir.join("peers.json")).unwrap()).unwrap()
    }

    /// A client certificate of the gateway's own (as it calls paired tool hosts with).
    fn gateway_certificate(&self) -> Issued {
        let (cert, key) = self.identity.issue_client_certificate().unwrap();
        issued(cert, key)
    }

    /// A client of `host`'s TLS listener that holds `cert` and trusts the gateway's CA.
    fn client(&self, host: &Running, cert: &Issued) -> Client {
        Client::new(Transport::Tls {
            address: host.tcp_address.unwrap(),
            config: tls_config(&self.identity.ca_cert_pem, Some(cert), false),
        })
    }

    async fn shutdown(self) {
        self.host.shutdown().await;
        self.gw.shutdown().await;
    }
}

#[tokio::test]
async fn pairing_records_the_tool_host_on_the_gateway_and_installs_its_certificate() {
    let env = Env::new().await;
    let paired = PairedHost::new(&env).await;
    assert_eq!(paired.reported["peer"]["component_type"], "tool_host");
    assert_eq!(paired.reported["peer"]["status"], "active");
    // The gateway recorded the peer; the tool host installed its certificate.
    let gw_peers = paired.gateway_peers();
    assert_eq!(gw_peers["peers"][0]["component_id"], "memory-east");
    assert_eq!(
        gw_peers["peers"][0]["mtls_cert_fingerprint"],
        paired.fingerprint()
    );
    let installed = installed_certificate(&env);
    assert_eq!(installed.fingerprint, paired.fingerprint());
    // ... and when the certificate it issued expires.
    let (_, parsed) =
        x509_parser::certificate::X509Certificate::from_der(installed.der.as_ref()).unwrap();
    let recorded = carapace::pairing::wire::GoTime::parse_rfc3339(
        gw_peers["peers"][0]["mtls_cert_not_after"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        recorded.unix_timestamp(),
        (parsed.validity().not_after.timestamp(), 0)
    );
    paired.shutdown().await;
}

/// The tool host now serves its issued certificate and trusts only the gateway's CA, and of
/// that CA's certificates only the gateway's own.
#[tokio::test]
async fn a_paired_tool_host_accepts_only_the_gateways_own_certificate() {
    let env = Env::new().await;
    let paired = PairedHost::new(&env).await;
    let host = &paired.host;
    // The gateway's client certificate gets through, and the app sees who called.
    let as_gateway = paired.client(host, &paired.gateway_certificate());
    let reply = as_gateway
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": "paired"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-carapace-peer-id"], "gw_home");

    // The certificate the tool host itself was issued (same CA, another name) is not the
    // gateway.
    let host_cert = installed_certificate(&env);
    let reply = paired
        .client(host, &host_cert)
        .post_json("/v1/tools/call", &[], &query())
        .await
        .unwrap();
    assert_eq!(code(&reply), "PAIRING_REQUIRED");
    // Nor is a certificate from the gateway's CA that merely has the gateway's name as its
    // common name: only the gateway's own certificate carries the gateway mark.
    let lookalike = {
        let mut params = rcgen::CertificateParams::new(vec!["gw_home".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "gw_home");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let identity = &paired.identity;
        let issuer =
            rcgen::Issuer::from_ca_cert_pem(&identity.ca_cert_pem, identity.ca_key()).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        issued(cert.pem(), key.serialize_pem())
    };
    let reply = paired
        .client(host, &lookalike)
        .post_json("/v1/tools/call", &[], &query())
        .await
        .unwrap();
    assert_eq!(code(&reply), "PAIRING_REQUIRED");
    // A certificate from the CA the tool host trusted before pairing (paired in its peer file
    // before) is no longer taken: the host trusts the gateway's CA alone.
    let before = paired
        .client(host, &env.pki.gateway)
        .post_json("/v1/tools/call", &[], &query())
        .await;
    assert!(before.is_err(), "{:?}", before.map(|r| r.json()));
    assert_eq!(env.app.received().len(), 1);
    paired.shutdown().await;
}

/// Another tool host claiming an id that is paired (another key) is not paired in its place;
/// the record and the tool host's trust stay as they were. Nor does the gateway pair anything
/// under its own name.
#[tokio::test]
async fn pairing_takes_neither_a_paired_id_nor_the_gateways_own_name() {
    let env = Env::new().await;
    let paired = PairedHost::new(&env).await;
    let impostor_url = impostor_endpoint(&env, &paired.identity).await;
    let (status, body) = carapace::admin::request(
        &paired.gw.admin_socket,
        Method::POST,
        "/v1/pairings",
        Some(json!({"component_type": "tool", "component_id": "memory-east", "endpoint": impostor_url})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let gw_peers = paired.gateway_peers();
    assert_eq!(gw_peers["peers"].as_array().unwrap().len(), 1, "{gw_peers}");
    assert_eq!(
        gw_peers["peers"][0]["mtls_cert_fingerprint"],
        paired.fingerprint()
    );
    // The tool host still serves the certificate of its pairing.
    assert_eq!(
        installed_certificate(&env).fingerprint,
        paired.fingerprint()
    );
    let as_gateway = paired.client(&paired.host, &paired.gateway_certificate());
    let reply = as_gateway
        .post_json("/v1/tools/call", &[], &query())
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());

    let (status, body) = carapace::admin::request(
        &paired.gw.admin_socket,
        Method::POST,
        "/v1/pairings",
        Some(json!({"component_type": "cli", "component_id": "gw_home",
                    "endpoint": format!("ws://{}/v1/pair", paired.host.pairing_address.unwrap())})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.to_string().contains("gw_home is reserved"), "{body}");
    paired.shutdown().await;
}

/// A pairing endpoint on loopback that answers as a tool host `memory-east` with keys of its
/// own, for the gateway of `identity`: its `ws://` URL.
async fn impostor_endpoint(env: &Env, identity: &GatewayIdentity) -> String {
    use carapace::pairing::handshake::{Installed, RemoteConfig};
    use carapace::pairing::transport::{PairingEndpoint, PairingSink};
    let other_dir = env.path().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other_host =
        Arc::new(carapace::pairing::identity::HostIdentity::load_or_create(&other_dir).unwrap());
    struct Nothing;
    impl PairingSink for Nothing {
        fn install(&self, _: &Installed) -> Result<(), String> {
            Ok(())
        }
        fn activate(&self, _: &Installed) -> Result<(), String> {
            Ok(())
        }
    }
    let nonces = carapace_filters::nonce::NonceStore::open(
        carapace_filters::nonce::NonceStoreConfig {
            capacity: 8,
            ttl: std::time::Duration::from_secs(600),
            journal: None,
        },
        0,
    )
    .unwrap();
    let endpoint = Arc::new(PairingEndpoint::new(
        RemoteConfig {
            component_type: "tool_host".into(),
            component_id: "memory-east".into(),
            gateway_public_key_ed25519: identity.public_key_ed25519(),
            endpoint_tls_fingerprint: String::new(),
        },
        other_host,
        Arc::new(nonces),
        "/v1/pair".into(),
        Arc::new(Nothing),
    ));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/v1/pair", l.local_addr().unwrap());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    // Served for the test's life: the sender is kept by the task.
    tokio::spawn(async move {
        endpoint.serve(l, stop_rx).await;
        drop(stop);
    });
    url
}

#[tokio::test]
async fn revoking_the_gateway_on_the_tool_host_refuses_it_and_outlives_a_restart() {
    let env = Env::new().await;
    let paired = PairedHost::new(&env).await;
    let gateway_cert = paired.gateway_certificate();
    let as_gateway = paired.client(&paired.host, &gateway_cert);
    let reply = as_gateway
        .post_json("/v1/tools/call", &[], &query())
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    let reached = env.app.received().len();

    // A connection the gateway holds open across the revocation.
    let mut open = as_gateway.open().await.unwrap();
    let on_it = open
        .send(Method::POST, "/v1/tools/call", &[], query().to_string())
        .await
        .unwrap();
    assert_eq!(on_it.json()["status"], "ok", "{:?}", on_it.json());
    let reached = reached + 1;

    let revoke = json!({"component_id": "gw_home"});
    let revoked = admin(&paired.host, "/v1/peers/revoke", Some(revoke)).await;
    assert_eq!(revoked, StatusCode::OK);
    // Its open connection is closed by the revocation, and a call on a new one is refused.
    wait_until(|| open.is_closed()).await;
    let reply = paired
        .client(&paired.host, &gateway_cert)
        .post_json("/v1/tools/call", &[], &query())
        .await
        .unwrap();
    assert_eq!(code(&reply), "FORBIDDEN");
    assert_eq!(env.app.received().len(), reached);

    // The state survives a restart of the tool host.
    let PairedHost {
        gw, host, identity, ..
    } = paired;
    host.shutdown().await;
    let again = env
        .start(&env.tools_yaml(&host_pairing(&identity.public_key_ed25519())))
        .await;
    let reply = Client::new(Transport::Tls {
        address: again.tcp_address.unwrap(),
        config: tls_config(&identity.ca_cert_pem, Some(&gateway_cert), false),
    })
    .post_json("/v1/tools/call", &[], &query())
    .await
    .unwrap();
    assert_eq!(
        code(&reply),
        "FORBIDDEN",
        "revocation forgotten across a restart"
    );
    assert_eq!(env.app.received().len(), reached);
    again.shutdown().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn the_admin_socket_validates_pairing_requests_like_the_crabstack_gateway() {
    let env = Env::new().await;
    let gw_dir = env.path().join("gw");
    let gw = start_gateway(&gw_dir, &gateway_yaml(&gw_dir, env.app_addr, None, "")).await;
    // The crabstack gateway's answers (`admin_api.json`): the same status and text, except
    // where the text carries an operating-system message or names our own check (502s: the
    // stable prefix). Cases needing its fake pairing service, or dialing a remote address,
    // are covered by real pairings elsewhere.
    let path = format!(
        "{}/../shared/vectors/crabstack/admin_api.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let vectors: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let exact = [
        "pair.wrong_method",
        "pair.empty_body",
        "pair.truncated_json",
        "pair.unknown_field",
        "pair.trailing_content",
        "pair.unsupported_component_type",
        "pair.missing_component_id",
        "real.endpoint_missing",
        "real.endpoint_http_scheme",
    ];
    let prefix = [
        (
            "real.ws_non_loopback",
            "mtls is required for remote pairing: ",
        ),
        ("real.dial_failure", "dial remote endpoint: "),
        (
            "real.localhost_ws_allowed_then_dial",
            "dial remote endpoint: ",
        ),
    ];
    let mut checked = 0;
    for case in vectors["cases"].as_array().unwrap() {
        let id = case["id"].as_str().unwrap();
        let expected_prefix = prefix.iter().find(|(p, _)| *p == id).map(|(_, t)| *t);
        if !exact.contains(&id) && expected_prefix.is_none() {
            continue;
        }
        let stream = tokio::net::UnixStream::connect(&gw.admin_socket)
            .await
            .unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let body = case["request_body"].as_str().unwrap_or("").to_string();
        let req = http::Request::builder()
            .method(case["method"].as_str().unwrap())
            .uri("/v1/pairings")
            .header("host", "localhost")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(
            resp.status().as_u16(),
            case["status"].as_u64().unwrap() as u16,
            "{id}"
        );
        use http_body_util::BodyExt;
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        let got = String::from_utf8_lossy(&got).into_owned();
        match expected_prefix {
            None => assert_eq!(got, case["response_body"].as_str().unwrap(), "{id}"),
            Some(p) => assert!(got.starts_with(p), "{id}: {got}"),
        }
        checked += 1;
    }
    assert_eq!(checked, exact.len() + prefix.len());
    gw.shutdown().await;
}

#[tokio::test]
async fn a_pairing_cut_off_after_the_certificate_was_issued_changes_nothing_on_restart() {
    use carapace::pairing::handshake::{GatewayHandshake, PairRequest, Progress};
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let env = Env::new().await;
    write_peers(&env.path().join("peers.json"), &[]);
    let gw_dir = env.path().join("gw");
    let gw = std::sync::Arc::new(
        carapace::pairing::identity::GatewayIdentity::load_or_create(&gw_dir, "gw_home").unwrap(),
    );
    let yaml = env.tools_yaml(&format!(
        "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{}\" }}",
        gw.public_key_ed25519()
    ));
    let host = env.start(&yaml).await;
    let addr = host.pairing_address.unwrap();
    let url = format!("ws://{addr}/v1/pair");

    // A gateway that sends pair.init, the challenge and pair.csr_issued, then vanishes.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
        .await
        .unwrap();
    let request = PairRequest {
        component_type: "tool_host".into(),
        component_id: "memory-east".into(),
        endpoint: url.clone(),
    };
    let now = std::time::SystemTime::now();
    let (mut hs, init) = GatewayHandshake::start(gw.clone(), request, None, now).unwrap();
    ws.send(Message::text(init)).await.unwrap();
    let mut issued_sent = false;
    while !issued_sent {
        let Some(Ok(Message::Text(t))) = ws.next().await else {
            panic!("the tool host closed early")
        };
        if let Progress::Continue(out) = hs.on_message(t.as_str(), now).unwrap() {
            for m in out {
                issued_sent |= m.contains("pair.csr_issued");
                ws.send(Message::text(m)).await.unwrap();
            }
        }
    }
    // Wait for the tool host's install confirmation, then disappear without pair.complete.
    let Some(Ok(Message::Text(t))) = ws.next().await else {
        panic!("no install confirmation")
    };
    assert!(t.as_str().contains("pair.csr_installed"));
    drop(ws);

    // Restarted (as after a crash at this point), the tool host is as before the pairing: the
    // configured listener TLS, no gateway record, so nothing paired is accepted.
    host.shutdown().await;
    let again = env.start(&yaml).await;
    assert!(carapace::tls::PairedFiles::current(&env.path().join("state")).is_none());
    assert!(again.shared.peers.records().is_empty());
    let reply = env
        .gateway(&again)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&reply), "PAIRING_REQUIRED");
    // The same pairing can then be run to completion.
    let peer = carapace::pairing::transport::pair(
        gw.clone(),
        PairRequest {
            component_type: "tool_host".into(),
            component_id: "memory-east".into(),
            endpoint: format!("ws://{}/v1/pair", again.pairing_address.unwrap()),
        },
        Box::new(|_| Ok(())),
    )
    .await
    .unwrap()
    .peer;
    assert_eq!(peer.component_id, "memory-east");
    assert!(carapace::tls::PairedFiles::current(&env.path().join("state")).is_some());
    again.shutdown().await;
}
