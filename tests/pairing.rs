//! Two carapace processes' worth of stack on loopback: a gateway pairs a tool host through
//! its admin socket, the tool host installs the issued certificate and the gateway CA, and
//! from then on only the paired gateway's certificate gets through.

mod common;

use carapace::client::{tls_config, Client, Transport};
use carapace::pki::Issued;
use common::{call, code, pair_through_admin, write_peers, Env};
use http::{Method, StatusCode};
use serde_json::json;
use x509_parser::prelude::FromDer;

fn issued(cert_pem: String, key_pem: String) -> Issued {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    Issued {
        fingerprint: carapace::tls::fingerprint(&der),
        cert_pem,
        key_pem,
        der,
    }
}

#[tokio::test]
async fn a_gateway_pairs_a_tool_host_which_then_accepts_only_that_gateway() {
    let env = Env::new().await;
    // The tool host starts with nothing paired.
    write_peers(&env.path().join("peers.json"), &[]);

    // The gateway: its own state directory and admin socket.
    let gw_dir = env.path().join("gw");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let gw_yaml = format!(
        r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
"#,
        d = gw_dir.display(),
        app = env.app_addr
    );
    std::fs::write(gw_dir.join("carapace.yaml"), &gw_yaml).unwrap();
    let gw =
        carapace::server::start(carapace::config::load(&gw_dir.join("carapace.yaml")).unwrap())
            .await
            .unwrap();
    let gw_identity = gw.shared.gateway.clone().expect("gateway role");

    // The tool host, configured with the gateway's public key.
    let host = env
        .start(&env.tools_yaml(&format!(
            "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{}\" }}",
            gw_identity.public_key_ed25519()
        )))
        .await;
    let pair_addr = host.pairing_address.expect("pairing endpoint");

    // Before pairing: PAIRING_REQUIRED.
    let before = env
        .gateway(&host)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&before), "PAIRING_REQUIRED");

    // The operator pairs it: `carapace pair tool ws://... memory-east` does exactly this.
    let (status, result) = carapace::admin::request(
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
    assert_eq!(status, StatusCode::OK, "{result}");
    let fingerprint = result["peer"]["mtls_cert_fingerprint"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(result["peer"]["component_type"], "tool_host");
    assert_eq!(result["peer"]["status"], "active");

    // The gateway recorded the peer; the tool host installed its certificate.
    let gw_peers: serde_json::Value =
        serde_json::from_slice(&std::fs::read(gw_dir.join("peers.json")).unwrap()).unwrap();
    assert_eq!(gw_peers["peers"][0]["component_id"], "memory-east");
    assert_eq!(
        gw_peers["peers"][0]["mtls_cert_fingerprint"],
        fingerprint.as_str()
    );
    let paired = carapace::tls::PairedFiles::current(&env.path().join("state")).unwrap();
    let installed_cert = std::fs::read_to_string(&paired.cert).unwrap();
    let installed = issued(installed_cert, String::new());
    assert_eq!(installed.fingerprint, fingerprint);
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

    // The tool host now serves its issued certificate and trusts only the gateway's CA: the
    // gateway's client certificate gets through, and the app sees who called.
    let (cert, key) = gw_identity.issue_client_certificate().unwrap();
    let gateway_cert = issued(cert, key);
    let as_gateway = Client::new(Transport::Tls {
        address: host.tcp_address.unwrap(),
        config: tls_config(&gw_identity.ca_cert_pem, Some(&gateway_cert), false),
    });
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
    assert_eq!(
        seen.last().unwrap().headers["x-carapace-peer-id"],
        "gw_home"
    );

    // The certificate the tool host itself was issued (same CA, another name) is not the
    // gateway.
    let key_pem = std::fs::read_to_string(&paired.key).unwrap();
    let host_cert = issued(installed.cert_pem.clone(), key_pem);
    let impostor = Client::new(Transport::Tls {
        address: host.tcp_address.unwrap(),
        config: tls_config(&gw_identity.ca_cert_pem, Some(&host_cert), false),
    });
    let reply = impostor
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
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
        let issuer =
            rcgen::Issuer::from_ca_cert_pem(&gw_identity.ca_cert_pem, gw_identity.ca_key())
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        issued(cert.pem(), key.serialize_pem())
    };
    let reply = Client::new(Transport::Tls {
        address: host.tcp_address.unwrap(),
        config: tls_config(&gw_identity.ca_cert_pem, Some(&lookalike), false),
    })
    .post_json(
        "/v1/tools/call",
        &[],
        &call("memory.query", json!({"query": "x"})),
    )
    .await
    .unwrap();
    assert_eq!(code(&reply), "PAIRING_REQUIRED");
    // Another tool host claiming an id that is paired (another key) is not paired in its
    // place; the record and the tool host's trust stay as they were.
    let other_dir = env.path().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other_host = std::sync::Arc::new(
        carapace::pairing::identity::HostIdentity::load_or_create(&other_dir).unwrap(),
    );
    struct Nothing;
    impl carapace::pairing::transport::PairingSink for Nothing {
        fn install(&self, _: &carapace::pairing::handshake::Installed) -> Result<(), String> {
            Ok(())
        }
        fn activate(&self, _: &carapace::pairing::handshake::Installed) -> Result<(), String> {
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
    let impostor_endpoint =
        std::sync::Arc::new(carapace::pairing::transport::PairingEndpoint::new(
            carapace::pairing::handshake::RemoteConfig {
                component_type: "tool_host".into(),
                component_id: "memory-east".into(),
                gateway_public_key_ed25519: gw_identity.public_key_ed25519(),
                endpoint_tls_fingerprint: String::new(),
            },
            other_host,
            std::sync::Arc::new(nonces),
            "/v1/pair".into(),
            std::sync::Arc::new(Nothing),
        ));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let impostor_url = format!("ws://{}/v1/pair", l.local_addr().unwrap());
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(impostor_endpoint.serve(l, stop_rx));
    let (status, body) = carapace::admin::request(
        &gw.admin_socket,
        Method::POST,
        "/v1/pairings",
        Some(json!({"component_type": "tool", "component_id": "memory-east", "endpoint": impostor_url})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let gw_peers: serde_json::Value =
        serde_json::from_slice(&std::fs::read(gw_dir.join("peers.json")).unwrap()).unwrap();
    assert_eq!(
        gw_peers["peers"][0]["mtls_cert_fingerprint"],
        fingerprint.as_str()
    );

    // And the gateway refuses to pair anything under its own name.
    let (status, _) = carapace::admin::request(
        &gw.admin_socket,
        Method::POST,
        "/v1/pairings",
        Some(json!({"component_type": "cli", "component_id": "gw_home",
                    "endpoint": format!("ws://{pair_addr}/v1/pair")})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A certificate from the CA the tool host trusted before pairing no longer connects.
    assert!(env
        .gateway(&host)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"}))
        )
        .await
        .is_err());
    let reached = env.app.received().len();

    // Revoking the gateway on the tool host fails its next request.
    let (status, _) = carapace::admin::request(
        &host.admin_socket,
        Method::POST,
        "/v1/peers/revoke",
        Some(json!({"component_id": "gw_home"})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    // Its open connection is closed by the revocation: a call on it fails with the
    // connection or is refused, and a call on a new one is refused.
    let query = call("memory.query", json!({"query": "x"}));
    if let Ok(reply) = as_gateway.post_json("/v1/tools/call", &[], &query).await {
        assert_eq!(code(&reply), "FORBIDDEN");
    }
    let again = Client::new(Transport::Tls {
        address: host.tcp_address.unwrap(),
        config: tls_config(&gw_identity.ca_cert_pem, Some(&gateway_cert), false),
    });
    let reply = again
        .post_json("/v1/tools/call", &[], &query)
        .await
        .unwrap();
    assert_eq!(code(&reply), "FORBIDDEN");
    assert_eq!(env.app.received().len(), reached);

    // The state survives a restart of the tool host.
    host.shutdown().await;
    let again = env.start(&env.tools_yaml(&format!(
        "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{}\" }}",
        gw_identity.public_key_ed25519()
    )))
    .await;
    let as_gateway = Client::new(Transport::Tls {
        address: again.tcp_address.unwrap(),
        config: tls_config(&gw_identity.ca_cert_pem, Some(&gateway_cert), false),
    });
    let reply = as_gateway
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(
        code(&reply),
        "FORBIDDEN",
        "revocation forgotten across a restart"
    );
    again.shutdown().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn the_admin_socket_validates_pairing_requests_like_the_crabstack_gateway() {
    let env = Env::new().await;
    let gw_dir = env.path().join("gw");
    std::fs::create_dir_all(&gw_dir).unwrap();
    std::fs::write(
        gw_dir.join("carapace.yaml"),
        format!(
            "state_dir: {d}/state\nfront: {{ protocol: tools-v1 }}\nlisteners: {{ unix: {{ path: {d}/t.sock }} }}\napp: {{ protocol: tools-v1, address: \"http://{app}\" }}\nops: {{ address: \"\" }}\ngateway: {{ id: gw_home }}\n",
            d = gw_dir.display(),
            app = env.app_addr
        ),
    )
    .unwrap();
    let gw =
        carapace::server::start(carapace::config::load(&gw_dir.join("carapace.yaml")).unwrap())
            .await
            .unwrap();
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

/// The gateway's configuration: gateway role, outbound socket to `memory-east` at `tools`.
fn gateway_yaml(
    dir: &std::path::Path,
    app: std::net::SocketAddr,
    tools: std::net::SocketAddr,
) -> String {
    format!(
        r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}", pool: {{ max_idle: 0 }} }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{ memory-east: {{ url: "https://{tools}" }} }}
"#,
        d = dir.display()
    )
}

#[tokio::test]
async fn a_call_to_the_gateways_socket_reaches_the_paired_tool_host_and_fails_closed_once_unpaired()
{
    let env = Env::new().await;
    write_peers(&env.path().join("peers.json"), &[]);
    let gw_dir = env.path().join("gw");
    std::fs::create_dir_all(gw_dir.join("state")).unwrap();
    // The gateway's identity exists before either side starts (the tool host needs its key).
    let gw_key = carapace::pairing::identity::GatewayIdentity::load_or_create(
        &gw_dir.join("state"),
        "gw_home",
    )
    .unwrap()
    .public_key_ed25519();
    let pairing = format!(
        "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{gw_key}\" }}"
    );
    let host = env.start(&env.tools_yaml(&pairing)).await;
    std::fs::write(
        gw_dir.join("carapace.yaml"),
        gateway_yaml(&gw_dir, env.app_addr, host.tcp_address.unwrap()),
    )
    .unwrap();
    let gw =
        carapace::server::start(carapace::config::load(&gw_dir.join("carapace.yaml")).unwrap())
            .await
            .unwrap();
    let agent = Client::new(Transport::Unix(gw_dir.join("outbound.sock")));

    // Nothing paired yet: the gateway routes nowhere.
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            code(&reply).as_str(),
            "TOOL_NOT_FOUND" | "DEPENDENCY_UNAVAILABLE"
        ),
        "{:?}",
        reply.json()
    );
    assert!(env.app.received().is_empty());

    pair_through_admin(&gw, &host, "memory-east").await;

    // Once the gateway has discovered the tool host's tools, the agent's call goes through.
    let mut listed = false;
    for _ in 0..100 {
        let list = agent.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
        if list.json()["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
        {
            listed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        listed,
        "the gateway did not discover the paired tool host's tools"
    );
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": "via gateway"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-carapace-peer-id"], "gw_home");
    assert_eq!(seen[0].body["args"]["text"], "via gateway");

    // The gateway's kill-switch holds for the outbound role too.
    let (status, _) = carapace::admin::request(
        &gw.admin_socket,
        Method::PUT,
        "/v1/kill-switch",
        Some(json!({"engaged": true, "tool": "memory.append"})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    let r = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": "no"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), "DEPENDENCY_UNAVAILABLE");
    assert_eq!(env.app.received().len(), 1);
    carapace::admin::request(
        &gw.admin_socket,
        Method::PUT,
        "/v1/kill-switch",
        Some(json!({"engaged": false, "tool": "memory.append"})),
    )
    .await
    .unwrap();

    // A retryable_error is retried once, and only for a call with an idempotency key.
    env.app
        .set_fault(Some(carapace::memory_app::Fault::Retryable));
    let before = env.app.received().len();
    let r = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(r.json()["status"], "retryable_error", "{:?}", r.json());
    assert_eq!(
        env.app.received().len(),
        before + 1,
        "retried without a key"
    );
    let mut keyed = call("memory.query", json!({"query": "x"}));
    keyed["idempotency_key"] = json!("query-x-1");
    let r = agent
        .post_json("/v1/tools/call", &[], &keyed)
        .await
        .unwrap();
    assert_eq!(r.json()["status"], "retryable_error");
    assert_eq!(
        env.app.received().len(),
        before + 3,
        "not retried exactly once"
    );
    env.app.set_fault(None);

    // Bad arguments are refused by the gateway before anything is sent.
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": 1})),
        )
        .await
        .unwrap();
    assert_eq!(code(&reply), "INVALID_ARGS");
    assert_eq!(env.app.received().len(), 4);

    // The tool host presents another certificate than the one paired: the gateway refuses it.
    let paired = carapace::tls::PairedFiles::current(&env.path().join("state")).unwrap();
    let original = std::fs::read(&paired.cert).unwrap();
    let original_key = std::fs::read(&paired.key).unwrap();
    let other = env.pki.ca.server(&["127.0.0.1"]);
    std::fs::write(&paired.cert, &other.cert_pem).unwrap();
    std::fs::write(&paired.key, &other.key_pem).unwrap();
    host.reload().await.unwrap();
    // (This gateway keeps no idle connections, so every call makes a new TLS handshake.)
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE", "{:?}", reply.json());
    assert_eq!(
        env.app.received().len(),
        4,
        "a swapped certificate was trusted"
    );
    std::fs::write(&paired.cert, &original).unwrap();
    std::fs::write(&paired.key, &original_key).unwrap();
    host.reload().await.unwrap();

    // Unpaired on the gateway: refused before any I/O, even over a pooled connection.
    let ok = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(ok.json()["status"], "ok", "{:?}", ok.json());
    let reached = env.app.received().len();
    let out = carapace::admin::request(
        &gw.admin_socket,
        Method::POST,
        "/v1/peers/revoke",
        Some(json!({"component_id": "memory-east"})),
    )
    .await
    .unwrap();
    assert_eq!(out.0, StatusCode::OK);
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&reply), "FORBIDDEN", "{:?}", reply.json());
    assert_eq!(env.app.received().len(), reached);
    gw.shutdown().await;
    host.shutdown().await;
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

#[tokio::test]
async fn the_gateway_routes_a_capability_to_its_skill_and_signs_the_run() {
    let env = Env::new().await;
    let secret = b"skill-secret-for-outbound";
    let (skill, skill_addr) =
        common::SkillApp::start(secret, common::SkillApp::vagus_manifest()).await;
    std::fs::write(env.path().join("skill.key"), secret).unwrap();
    let d = env.path().join("gw");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("carapace.yaml"),
        format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{}}
  skills:
    demo.echo:
      url: "http://{skill_addr}"
      capabilities: [demo.echo]
      auth: {{ mode: hmac, header_name: X-Skill-Signature, secret: {{ file: {key} }} }}
"#,
            d = d.display(),
            app = env.app_addr,
            key = env.path().join("skill.key").display(),
        ),
    )
    .unwrap();
    let gw = carapace::server::start(carapace::config::load(&d.join("carapace.yaml")).unwrap())
        .await
        .unwrap();
    let agent = Client::new(Transport::Unix(d.join("outbound.sock")));
    let mut reply = None;
    for _ in 0..100 {
        let r = agent
            .post_json(
                "/v1/tools/call",
                &[],
                &call("demo.echo", json!({"message": "hi"})),
            )
            .await
            .unwrap();
        if r.json()["status"] == "ok" {
            reply = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let reply = reply.expect("the capability was never routed");
    assert_eq!(reply.json()["result"]["result"], "echo:hi");
    // The skill verified the HMAC itself (it answers 401 otherwise) and saw a fresh run.
    let received = skill.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].1["capability"], "demo.echo");
    assert_eq!(received[0].1["nonce"].as_str().unwrap().len(), 32);

    // Bad arguments never reach the skill; an output breaking the schema never reaches the
    // agent.
    let r = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("demo.echo", json!({"message": 5})),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), "INVALID_ARGS");
    *skill.answer.lock().unwrap() = Some((200, json!({"ok": true, "output": {"secret": "x"}})));
    let r = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("demo.echo", json!({"message": "hi"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), "DEPENDENCY_UNAVAILABLE");
    assert_eq!(r.json()["error"]["details"]["reason"], "output_schema");
    assert!(!String::from_utf8_lossy(&r.body).contains("\"x\""));
    assert_eq!(skill.received.lock().unwrap().len(), 2);
    gw.shutdown().await;
}
