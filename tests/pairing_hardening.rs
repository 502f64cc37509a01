//! Pairing under hostile or failing peers: peer-chosen names never reach the file system,
//! the gateway claims only the success it has seen, a pairing is usable as soon as it is
//! reported, and the outbound role passes the tool host's answers through.

mod common;

use std::path::Path;

use carapace::pairing::identity::GatewayIdentity;
use carapace::pairing::wire::{
    decode_message, new_nonce, GoTime, PairGatewayInfo, PairInit, PairMessage, SignedMessage,
    WireMessage,
};
use common::{write_peers, Env};
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
