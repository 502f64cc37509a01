//! Two carapace processes' worth of stack on loopback: a gateway pairs a tool host through
//! its admin socket, the tool host installs the issued certificate and the gateway CA, and
//! from then on only the paired gateway's certificate gets through.

mod common;

use std::sync::Arc;

use carapace::client::{tls_config, Client, Transport};
use carapace::pki::Issued;
use common::{call, code, write_peers, Env};
use http::{Method, StatusCode};
use serde_json::json;

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
    let installed_cert =
        std::fs::read_to_string(env.path().join("state/pairing/mtls.crt")).unwrap();
    let installed = issued(installed_cert, String::new());
    assert_eq!(installed.fingerprint, fingerprint);

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
    let key_pem = std::fs::read_to_string(env.path().join("state/pairing/mtls.key")).unwrap();
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
    assert_eq!(code(&reply), "FORBIDDEN");
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
    let reply = as_gateway
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
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
    drop(Arc::clone(&gw_identity));
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
    let cases = [
        (
            json!({"component_type": "router", "component_id": "x", "endpoint": "ws://127.0.0.1:1/v1/pair"}),
            400,
            "unsupported component type: router",
        ),
        (
            json!({"component_type": "tool", "component_id": "  ", "endpoint": "ws://127.0.0.1:1/v1/pair"}),
            400,
            "component_id is required",
        ),
        (
            json!({"component_type": "tool", "component_id": "x", "endpoint": ""}),
            400,
            "invalid pairing request: endpoint is required",
        ),
        (
            json!({"component_type": "tool", "component_id": "x", "endpoint": "http://127.0.0.1:1"}),
            400,
            "invalid pairing request: endpoint must be ws:// or wss://",
        ),
        (
            json!({"component_type": "tool", "component_id": "x", "endpoint": "ws://127.0.0.1:1", "role": "admin"}),
            400,
            "invalid json",
        ),
        (
            json!({"component_type": "tool", "component_id": "x", "endpoint": "ws://10.0.0.1:5225"}),
            502,
            "mtls is required for remote pairing",
        ),
    ];
    for (body, status, text) in cases {
        let stream = tokio::net::UnixStream::connect(&gw.admin_socket)
            .await
            .unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = http::Request::post("/v1/pairings")
            .header("host", "localhost")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{body}");
        use http_body_util::BodyExt;
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with(text), "{body}: {got}");
    }
    gw.shutdown().await;
}
