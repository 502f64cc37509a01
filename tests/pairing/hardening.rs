//! Pairing under hostile or failing peers: peer-chosen names never reach the file system,
//! the gateway claims only the success it has seen, a pairing is usable as soon as it is
//! reported, and the outbound role passes the tool host's answers through.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::{call, code, write_peers, Env};
use crate::{
    admin, gateway_yaml, query, request_pairing, start_gateway, tool_host_and_gateway, Paired,
};
use carapace::client::{Client, Transport};
use carapace::pairing::identity::GatewayIdentity;
use carapace::pairing::wire::{
    decode_message, new_nonce, GoTime, PairGatewayInfo, PairInit, PairMessage, SignedMessage,
    WireMessage,
};
use carapace_filters::signature::UnixClock;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// A `pair.init` for `pairing_id` from `gateway_id`, properly signed by `gw`.
fn signed_init(gw: &GatewayIdentity, pairing_id: &str, gateway_id: &str) -> String {
    let now = GoTime::from_system_time(std::time::SystemTime::now())
        .and_then(|t| t.to_rfc3339_nano())
        .unwrap();
    let mut init = PairInit::new(
        pairing_id,
        PairGatewayInfo {
            gateway_id: gateway_id.into(),
            public_key_ed25519: gw.public_key_ed25519(),
            nonce: new_nonce(),
            issued_at: now,
        },
    );
    init.sign_with(&gw.signing_key()).unwrap();
    init.to_wire().unwrap()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn a_signed_init_whose_pairing_id_is_a_path_is_refused_and_writes_nothing() {
    let env = Env::new().await;
    write_peers(&env.path().join("peers.json"), &[]);
    let gw = GatewayIdentity::load_or_create(&env.path().join("gw"), "gw_home").unwrap();
    let yaml = env.tools_yaml(&format!(
        "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{}\" }}",
        gw.public_key_ed25519()
    ));
    let host = env.start(&yaml).await;
    let addr = host.pairing_address.unwrap();
    let url = format!("ws://{addr}/v1/pair");
    let outside = env.path().join("outside");
    let before = files_under(env.path());
    let good_id = "a3f3553b6b9b3861a24253b5cb7c43a7";
    for (pairing_id, gateway_id, refused) in [
        ("../../x".to_string(), "gw_home", "pairing_id"),
        (outside.display().to_string(), "gw_home", "pairing_id"),
        (good_id.to_uppercase(), "gw_home", "pairing_id"),
        (good_id.to_string(), "../gw", "gateway_id"),
        (good_id.to_string(), "local", "gateway_id"),
        (good_id.to_string(), "gw\nhome", "gateway_id"),
    ] {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
            .await
            .unwrap();
        ws.send(Message::text(signed_init(&gw, &pairing_id, gateway_id)))
            .await
            .unwrap();
        let Some(Ok(Message::Text(answer))) = ws.next().await else {
            panic!("no answer to {pairing_id}")
        };
        match decode_message(answer.as_str()).unwrap() {
            PairMessage::Error(e) => {
                assert_eq!(e.code, "HANDSHAKE_FAILED");
                assert!(e.message.contains(refused), "{}", e.message);
            }
            other => panic!("{pairing_id}: answered {other:?}"),
        }
    }
    // Nothing was written anywhere: not outside the state directory, not inside it.
    assert!(!env.path().join("x").exists());
    assert!(!outside.exists());
    assert!(carapace::tls::PairedFiles::current(&env.path().join("state")).is_none());
    let written: Vec<_> = files_under(env.path())
        .into_iter()
        .filter(|p| !before.contains(p))
        .filter(|p| p.extension().is_some_and(|e| e == "key" || e == "crt"))
        .collect();
    assert!(written.is_empty(), "{written:?}");
    host.shutdown().await;
}

/// A tool host that runs the real handshake and dies (drops the connection) right after its
/// `pair.csr_installed` is sent, before it could handle `pair.complete`, as with `kill -9`.
async fn dying_tool_host(gateway_key: String) -> std::net::SocketAddr {
    use carapace::pairing::handshake::{Progress, RemoteConfig, RemoteHandshake};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let nonces = carapace_filters::nonce::NonceStore::open(
            carapace_filters::nonce::NonceStoreConfig {
                capacity: 8,
                ttl: std::time::Duration::from_secs(600),
                journal: None,
            },
            0,
        )
        .unwrap();
        let mut hs = RemoteHandshake::new(
            RemoteConfig {
                component_type: "tool_host".into(),
                component_id: "memory-east".into(),
                gateway_public_key_ed25519: gateway_key,
                endpoint_tls_fingerprint: String::new(),
            },
            std::sync::Arc::new(carapace::pairing::identity::HostIdentity::from_keys(
                rand::random(),
                rand::random(),
            )),
            std::sync::Arc::new(nonces),
        );
        while let Some(Ok(Message::Text(t))) = ws.next().await {
            let Ok(Progress::Continue(out)) =
                hs.on_message(t.as_str(), std::time::SystemTime::now())
            else {
                return;
            };
            for m in out {
                let last = m.contains("pair.csr_installed");
                ws.send(Message::text(m)).await.unwrap();
                if last {
                    // Killed: no close frame, nothing more.
                    return;
                }
            }
        }
    });
    addr
}

#[tokio::test]
async fn a_tool_host_that_dies_after_csr_installed_is_not_reported_paired_nor_recorded() {
    let env = Env::new().await;
    for (name, dials) in [("plain", false), ("dialing", true)] {
        let dir = env.path().join(name);
        let key = GatewayIdentity::load_or_create(&dir.join("state"), "gw_home")
            .unwrap()
            .public_key_ed25519();
        let host = dying_tool_host(key).await;
        // The gateway that calls memory-east is pointed at a port where nothing answers.
        let nowhere = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let gw = start_gateway(
            &dir,
            &gateway_yaml(&dir, env.app_addr, dials.then_some(nowhere), ""),
        )
        .await;
        let (status, body) = request_pairing(&gw, &format!("ws://{host}/v1/pair")).await;
        assert_eq!(status, http::StatusCode::BAD_GATEWAY, "{name}: {body}");
        let why = body["error"].as_str().unwrap_or_default();
        assert!(why.contains("pairing not confirmed"), "{name}: {why}");
        // Nothing recorded, not even pending.
        assert!(gw.shared.peers.records().is_empty(), "{name}");
        assert!(gw.shared.peers.active("memory-east").is_none());
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn a_restart_removes_what_unfinished_pairings_left() {
    let env = Env::new().await;
    // A gateway killed while a pairing was pending, and a tool host killed after it
    // installed a pairing's files but before it activated it.
    let dir = env.path().join("gw");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("peers.json"),
        serde_json::json!({"version": 1, "peers": [
            {"component_type": "tool_host", "component_id": "memory-east",
             "mtls_cert_fingerprint": format!("sha256:{}", "ab".repeat(32)), "status": "pending"},
            {"component_type": "tool_host", "component_id": "memory-west",
             "mtls_cert_fingerprint": format!("sha256:{}", "cd".repeat(32)), "status": "active"}
        ]})
        .to_string(),
    )
    .unwrap();
    let gw = start_gateway(&dir, &gateway_yaml(&dir, env.app_addr, None, "")).await;
    let left: Vec<_> = gw
        .shared
        .peers
        .records()
        .into_iter()
        .map(|r| (r.component_id, r.status))
        .collect();
    assert_eq!(left, [("memory-west".to_string(), "active".to_string())]);
    gw.shutdown().await;

    write_peers(&env.path().join("peers.json"), &[]);
    let state = env.path().join("state");
    let unfinished =
        carapace::tls::PairedFiles::of(&state, "a3f3553b6b9b3861a24253b5cb7c43a7").unwrap();
    std::fs::create_dir_all(&unfinished.dir).unwrap();
    std::fs::write(&unfinished.key, "key").unwrap();
    let host = env.start(&env.tools_yaml("")).await;
    assert!(!unfinished.dir.exists());
    host.shutdown().await;
}

#[tokio::test]
async fn a_pairing_is_usable_as_soon_as_it_is_reported() {
    let env = Env::new().await;
    let (host, gw, dir) =
        tool_host_and_gateway(&env, "", Arc::new(carapace_filters::unix_now_ms)).await;
    let endpoint = format!("ws://{}/v1/pair", host.pairing_address.unwrap());
    let (status, body) = request_pairing(&gw, &endpoint).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    assert_eq!(body["peer"]["status"], "active");
    // At once, no waiting: the call goes through.
    let agent = Client::new(Transport::Unix(dir.join("outbound.sock")));
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", serde_json::json!({"text": "at once"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    gw.shutdown().await;
    host.shutdown().await;
}

/// The gateway's client certificate is issued again at half its year; the client for a tool
/// host is then made again with the new one, and the tool host (which pinned the gateway by
/// its pairing CA and id) takes it: the calls go on, under the new certificate from then on.
#[tokio::test]
async fn calls_go_on_under_the_gateways_renewed_client_certificate() {
    let env = Env::new().await;
    let now = Arc::new(AtomicU64::new(carapace_filters::unix_now_ms()));
    let clock: UnixClock = {
        let now = now.clone();
        Arc::new(move || now.load(Ordering::SeqCst))
    };
    let paired = Paired::new(&env, "", clock).await;
    let presented = || async {
        let reply = paired.ask(&query()).await;
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
        let seen = env.app.received().last().unwrap().headers.clone();
        assert_eq!(seen["x-carapace-peer-id"], "gw_home");
        seen["x-carapace-peer-fingerprint"].clone()
    };
    let first = presented().await;
    assert_eq!(presented().await, first, "kept while it is young");
    // Past half of the certificate's year (182 days) by the gateway's clock.
    now.fetch_add(183 * 24 * 3600 * 1000, Ordering::SeqCst);
    let renewed = presented().await;
    assert_ne!(renewed, first, "the call went under the old certificate");
    assert_eq!(presented().await, renewed);
    paired.shutdown().await;
}

#[tokio::test]
async fn a_refusal_by_the_tool_host_reaches_the_agent_as_the_tool_host_said_it() {
    let env = Env::new().await;
    let paired = Paired::plain(&env).await;
    let reply = paired.ask(&query()).await;
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());

    // The tool host revokes the gateway: a denial, not an outage.
    let revoke = serde_json::json!({"component_id": "gw_home"});
    let revoked = admin(&paired.host, "/v1/peers/revoke", Some(revoke)).await;
    assert_eq!(revoked, http::StatusCode::OK);
    let mut keyed = query();
    keyed["idempotency_key"] = serde_json::json!("q-1");
    let reached = env.app.received().len();
    let reply = paired.ask(&keyed).await;
    let v = reply.json();
    assert_eq!(code(&reply), "FORBIDDEN", "{v:?}");
    assert_eq!(v["status"], "error", "{v:?}");
    assert_eq!(v["error"]["retryable"], false, "{v:?}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gw_home is revoked"),
        "{v:?}"
    );
    assert_eq!(env.app.received().len(), reached);
    paired.shutdown().await;
}

#[tokio::test]
async fn a_revoked_tool_host_gets_the_same_answer_before_and_after_a_gateway_restart() {
    let env = Env::new().await;
    let Paired { host, gw, dir, .. } = Paired::plain(&env).await;
    let revoke = serde_json::json!({"component_id": "memory-east"});
    assert_eq!(
        admin(&gw, "/v1/peers/revoke", Some(revoke)).await,
        http::StatusCode::OK
    );
    let ask = || async {
        let agent = Client::new(Transport::Unix(dir.join("outbound.sock")));
        let reply = agent
            .post_json("/v1/tools/call", &[], &query())
            .await
            .unwrap();
        let v = reply.json();
        (
            reply.status,
            v["error"]["code"].clone(),
            v["error"]["message"].clone(),
        )
    };
    let before = ask().await;
    assert_eq!(before.1, "FORBIDDEN", "{before:?}");
    assert!(
        before
            .2
            .as_str()
            .unwrap()
            .contains("memory-east is revoked"),
        "{before:?}"
    );
    // A later discovery does not change it, nor does a restart.
    gw.shared
        .outbound
        .get()
        .unwrap()
        .refresh(&gw.shared.config.load_full())
        .await;
    assert_eq!(ask().await, before);
    gw.shutdown().await;
    let gw = start_gateway(
        &dir,
        &gateway_yaml(&dir, env.app_addr, Some(host.tcp_address.unwrap()), ""),
    )
    .await;
    assert_eq!(ask().await, before);
    gw.shutdown().await;
    host.shutdown().await;
}

/// Set `policy` on every record of `component_id` in the peer file at `path`.
fn set_policy(path: &Path, component_id: &str, policy: serde_json::Value) {
    let mut file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    for p in file["peers"].as_array_mut().unwrap() {
        if p["component_id"] == component_id {
            p["policy"] = policy.clone();
        }
    }
    std::fs::write(path, serde_json::to_vec_pretty(&file).unwrap()).unwrap();
}

/// What a tool host's operator decided about its gateway outlives the gateway's pairings: a
/// deny set on its record stays when the gateway pairs again (a renewal), and a gateway
/// revoked here cannot pair its way back to `active`.
#[tokio::test]
async fn a_tool_host_keeps_its_gateways_policy_and_revocation_when_the_gateway_pairs_again() {
    let env = Env::new().await;
    let paired = Paired::plain(&env).await;
    let (host, gw, dir, endpoint) = (&paired.host, &paired.gw, &paired.dir, &paired.endpoint);
    let append = || call("memory.append", serde_json::json!({"text": "x"}));
    let ask = |body: serde_json::Value| {
        let paired = &paired;
        async move { paired.ask(&body).await }
    };

    let peers = env.path().join("peers.json");
    set_policy(
        &peers,
        "gw_home",
        serde_json::json!({"deny": ["tool.call:memory.append"]}),
    );
    assert_eq!(admin(host, "/v1/reload", None).await, http::StatusCode::OK);
    assert_eq!(code(&ask(append()).await), "FORBIDDEN");

    // The gateway's operator set a policy on the host's record too.
    let gw_peers = dir.join("peers.json");
    let gw_policy =
        serde_json::json!({"allow": [], "deny": ["tool.call:memory.delete"], "leases": []});
    set_policy(&gw_peers, "memory-east", gw_policy.clone());
    assert_eq!(admin(gw, "/v1/reload", None).await, http::StatusCode::OK);

    // Paired again, the gateway lists the host's tools anew: the denied one is not offered.
    let (status, body) = request_pairing(gw, endpoint).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&gw_peers).unwrap()).unwrap();
    let records: Vec<&serde_json::Value> = file["peers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["component_id"] == "memory-east")
        .collect();
    assert_eq!(records.len(), 1, "{file}");
    assert_eq!(records[0]["status"], "active");
    assert_eq!(records[0]["policy"], gw_policy);
    let reached = env.app.received().len();
    assert_eq!(code(&ask(append()).await), "TOOL_NOT_FOUND");
    assert_eq!(env.app.received().len(), reached);
    assert_eq!(ask(query()).await.json()["status"], "ok");

    let revoke = serde_json::json!({"component_id": "gw_home"});
    let revoked = admin(host, "/v1/peers/revoke", Some(revoke)).await;
    assert_eq!(revoked, http::StatusCode::OK);
    let (status, body) = request_pairing(gw, endpoint).await;
    assert_ne!(status, http::StatusCode::OK, "{body}");
    assert!(body.to_string().contains("could not install"), "{body}");
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&peers).unwrap()).unwrap();
    let statuses: Vec<&serde_json::Value> = file["peers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["component_id"] == "gw_home")
        .map(|p| &p["status"])
        .collect();
    assert_eq!(statuses, ["revoked"]);
    assert_eq!(code(&ask(query()).await), "FORBIDDEN");
    paired.shutdown().await;
}
