//! The generic HTTP edge: request ids from the caller to the app and back, and a panic in one
//! call answered in the front's envelope while the connection and the process carry on.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use carapace::client::tls_config;
use common::{call, Env};
use rustls_pki_types::ServerName;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn a_request_id_goes_from_the_caller_to_the_app_and_back() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let gw = env.gateway(&r);
    let query = call("memory.query", json!({"query": "x"}));

    // The caller's own id, when it is a plain one.
    let reply = gw
        .post_json("/v1/tools/call", &[("x-request-id", "req-42.a")], &query)
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok");
    assert_eq!(reply.headers["x-request-id"], "req-42.a");
    let seen = env.app.received();
    assert_eq!(seen.last().unwrap().headers["x-request-id"], "req-42.a");

    // None, or one that is not plain: carapace makes one, and the app gets the same.
    for sent in [None, Some("a b<script>"), Some(&*"x".repeat(200))] {
        let headers: Vec<(&str, &str)> = sent.iter().map(|v| ("x-request-id", *v)).collect();
        let reply = gw
            .post_json("/v1/tools/call", &headers, &query)
            .await
            .unwrap();
        let id = reply.headers["x-request-id"].to_str().unwrap().to_string();
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        let seen = env.app.received();
        assert_eq!(seen.last().unwrap().headers["x-request-id"], id.as_str());
    }

    // A refused call carries its id too.
    let mut bad = call("memory.append", json!({"text": 5}));
    bad["call_id"] = json!("c-bad");
    let reply = gw
        .post_json("/v1/tools/call", &[("x-request-id", "req-43")], &bad)
        .await
        .unwrap();
    assert_eq!(reply.json()["error"]["code"], "INVALID_ARGS");
    assert_eq!(reply.headers["x-request-id"], "req-43");
    r.shutdown().await;
}

/// A panic while serving a call: `INTERNAL` in the tools-v1 envelope, and the same connection
/// then serves the next call.
#[tokio::test]
async fn a_panic_in_one_call_answers_internal_and_the_connection_carries_on() {
    let env = Env::new().await;
    let broken = Arc::new(AtomicBool::new(false));
    let clock: carapace_filters::signature::UnixClock = {
        let broken = broken.clone();
        Arc::new(move || {
            assert!(!broken.load(Ordering::SeqCst), "the clock broke");
            carapace_filters::unix_now_ms()
        })
    };
    let r = env.start_clocked(&env.tools_yaml(""), true, clock).await;
    let addr = r.tcp_address.unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let config = tls_config(&env.pki.ca.cert_pem(), Some(&env.pki.gateway), false);
    let mut conn = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::from(addr.ip()), tcp)
        .await
        .unwrap();
    let body = call("memory.query", json!({"query": "x"})).to_string();
    let request = format!(
        "POST /v1/tools/call HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let exchange = async |conn: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>| {
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).to_string()
    };

    broken.store(true, Ordering::SeqCst);
    let answer = exchange(&mut conn).await;
    broken.store(false, Ordering::SeqCst);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""code":"INTERNAL""#), "{answer}");
    assert!(!answer.contains("the clock broke"), "{answer}");

    let answer = exchange(&mut conn).await;
    assert!(answer.contains(r#""status":"ok""#), "{answer}");
    r.shutdown().await;
}
