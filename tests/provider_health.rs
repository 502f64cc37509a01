//! Provider health on the gateway side: a paired peer that stops answering opens its circuit,
//! calls fail fast, and the circuit closes once the peer answers again.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP forwarder to `target` that can be cut: while down, new connections are closed at
/// once and open ones are dropped.
struct Switch {
    address: SocketAddr,
    up: watch::Sender<bool>,
}

impl Switch {
    async fn start(target: Arc<std::sync::Mutex<Option<SocketAddr>>>) -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (up, rx) = watch::channel(true);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let mut rx = rx.clone();
                let target = *target.lock().unwrap();
                tokio::spawn(async move {
                    let (Some(target), true) = (target, *rx.borrow()) else {
                        return;
                    };
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|up| !up) => {}
                    }
                });
            }
        });
        Switch { address, up }
    }

    fn set(&self, up: bool) {
        self.up.send_replace(up);
    }
}

#[tokio::test]
async fn a_peer_that_stops_answering_opens_its_circuit_and_closes_it_when_back() {
    let env = Env::new().await;
    let target = Arc::new(std::sync::Mutex::new(None));
    let switch = Switch::start(target.clone()).await;
    // The gateway reaches the host through the switch.
    let via = |host: SocketAddr| {
        *target.lock().unwrap() = Some(host);
        switch.address
    };
    let (host, gw, agent) = paired(
        &env,
        "",
        "",
        "  health: { failures_to_open: 3, backoff_ms: 300, max_backoff_ms: 1000 }",
        Some(&via),
    )
    .await;
    let append = || call("memory.append", json!({"text": "x"}));
    let r = agent
        .post_json("/v1/tools/call", &[], &append())
        .await
        .unwrap();
    assert_eq!(r.json()["status"], "ok", "{:?}", r.json());

    // The peer stops answering: three failures open the circuit.
    switch.set(false);
    for _ in 0..3 {
        let r = agent
            .post_json("/v1/tools/call", &[], &append())
            .await
            .unwrap();
        assert_eq!(code(&r), "DEPENDENCY_UNAVAILABLE", "{:?}", r.json());
        assert_eq!(r.json()["error"]["details"]["reason"], "app_unavailable");
    }
    let started = Instant::now();
    let r = agent
        .post_json("/v1/tools/call", &[], &append())
        .await
        .unwrap();
    assert_eq!(code(&r), "DEPENDENCY_UNAVAILABLE");
    assert_eq!(r.json()["error"]["details"]["reason"], "circuit_open");
    assert_eq!(r.json()["status"], "retryable_error");
    assert!(started.elapsed() < Duration::from_millis(200));
    let metrics = gw.shared.metrics.encode();
    assert!(
        metrics.contains(r#"carapace_provider_circuit_open{provider="memory-east"} 1"#),
        "{metrics}"
    );
    let (_, peers) =
        carapace::admin::request(&gw.admin_socket, http::Method::GET, "/v1/peers", None)
            .await
            .unwrap();
    let provider = &peers["providers"][0];
    assert_eq!(provider["id"], "memory-east");
    assert_eq!(provider["state"], "open");
    assert!(provider["last_seen_at"].is_string(), "{peers}");
    // Tool search marks the tools of the unhealthy peer.
    let found = agent
        .send(http::Method::GET, "/v1/tools/search?q=memory", &[], "")
        .await
        .unwrap()
        .json();
    assert_eq!(found["results"][0]["healthy"], false, "{found}");
    assert_eq!(found["results"][0]["circuit"], "open");

    // Back: after the backoff one call probes, it succeeds, the circuit closes.
    switch.set(true);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let r = agent
        .post_json("/v1/tools/call", &[], &append())
        .await
        .unwrap();
    assert_eq!(r.json()["status"], "ok", "{:?}", r.json());
    let (_, peers) =
        carapace::admin::request(&gw.admin_socket, http::Method::GET, "/v1/peers", None)
            .await
            .unwrap();
    assert_eq!(peers["providers"][0]["state"], "closed");
    assert!(gw
        .shared
        .metrics
        .encode()
        .contains(r#"carapace_provider_circuit_open{provider="memory-east"} 0"#));
    gw.shutdown().await;
    host.shutdown().await;
}
