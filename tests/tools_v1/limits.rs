//! The limits of the tools-v1 front: the kill-switch, rate limits and quotas, load shedding,
//! body size and slow clients, and the connection cap.

use super::*;

#[tokio::test]
async fn the_kill_switch_refuses_without_reaching_the_app() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("kill_switch: { tools: [memory.delete] }"))
        .await;
    let gw = env.gateway(&r);
    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "m1"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");
    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok");

    // Global, from the admin socket: even discovery is refused, without reading the body.
    let (status, _) = carapace::admin::request(
        &r.admin_socket,
        Method::PUT,
        "/v1/kill-switch",
        Some(json!({"engaged": true})),
    )
    .await
    .unwrap();
    assert!(status.is_success());
    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");
    assert_eq!(env.app.received().len(), 1);

    // Remembered across a restart.
    r.shutdown().await;
    let r = env
        .start(&env.tools_yaml("kill_switch: { tools: [memory.delete] }"))
        .await;
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");
    r.shutdown().await;
}

#[tokio::test]
async fn rate_limits_per_peer_and_per_tool_answer_with_retry_after() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml(
            "rate_limits: { per_peer: { per_second: 1, burst: 3 }, tools: { memory.delete: { per_second: 1, burst: 1 } } }",
        ))
        .await;
    let gw = env.gateway(&r);
    let first = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "a"})),
        )
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::OK);
    let second = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "b"})),
        )
        .await
        .unwrap();
    assert_error(&second, StatusCode::OK, "RATE_LIMITED");
    assert_eq!(second.json()["error"]["details"]["scope"], "tool");
    assert_eq!(second.json()["status"], "retryable_error");
    assert!(second.headers.contains_key("retry-after"));
    let third = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(third.status, StatusCode::OK);
    let fourth = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&fourth, StatusCode::OK, "RATE_LIMITED");
    assert_eq!(fourth.json()["error"]["details"]["scope"], "peer");
    let retry: u64 = fourth.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    // The local principal has its own budget.
    let local = env
        .local(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(local.status, StatusCode::OK);
    assert_eq!(env.app.received().len(), 3);
    r.shutdown().await;
}

#[tokio::test]
async fn calls_beyond_the_concurrency_limit_are_shed() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { max_in_flight: 1 }"))
        .await;
    let gw = env.gateway(&r);
    let slow = call("memory.query", json!({"query": "x", "delay_ms": 1500}));
    let held = tokio::spawn({
        let gw = gw.clone();
        async move { gw.post_json("/v1/tools/call", &[], &slow).await.unwrap() }
    });
    wait_until(|| env.app.received().len() == 1).await;
    let shed = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "y"})),
        )
        .await
        .unwrap();
    assert_error(&shed, StatusCode::OK, "RATE_LIMITED");
    assert!(shed.headers.contains_key("retry-after"));
    assert_eq!(held.await.unwrap().json()["status"], "ok");
    assert_eq!(env.app.received().len(), 1);
    r.shutdown().await;
}

/// Write raw bytes on the Unix socket and read until the server closes (bounded).
async fn raw_exchange(path: &std::path::Path, bytes: &[u8]) -> String {
    let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("server did not close the connection")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn body_size_and_slow_clients_are_bounded() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml(
            "limits: { max_body_bytes: 300, body_timeout_ms: 200, header_read_timeout_ms: 200 }",
        ))
        .await;
    let sock = r.unix_path.clone().unwrap();

    // Declared too large: refused before the body is sent at all.
    let answer = raw_exchange(
        &sock,
        b"POST /v1/tools/call HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("INVALID_ARGS"), "{answer}");

    // Undeclared (chunked) and too large: caught while reading.
    let chunk = "x".repeat(200);
    let chunked = format!(
        "POST /v1/tools/call HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{n:x}\r\n{chunk}\r\n{n:x}\r\n{chunk}\r\n0\r\n\r\n",
        n = chunk.len()
    );
    let answer = raw_exchange(&sock, chunked.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // The same limit holds on HTTP/2 (mTLS), where there is no chunked encoding.
    let big = call("memory.append", json!({"text": "x".repeat(400)}));
    let reply = env
        .tls_client(&r, Some(&env.pki.gateway), true)
        .post_json("/v1/tools/call", &[], &big)
        .await
        .unwrap();
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "INVALID_ARGS");

    // A body that stops arriving hits the body deadline.
    let answer = raw_exchange(
        &sock,
        b"POST /v1/tools/call HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"version\":",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // Headers that stop arriving hit the header-read timeout: the connection is closed.
    let answer = raw_exchange(&sock, b"POST /v1/tools/call HTTP/1.1\r\nhost: x\r\n").await;
    assert!(!answer.contains("200 OK"), "{answer}");

    assert!(env.app.received().is_empty());
    r.shutdown().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_accept() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("limits: { max_connections: 1 }"))
        .await;
    let sock = r.unix_path.clone().unwrap();
    // The first connection is served (so it holds the only slot) and kept open.
    let mut held = tokio::net::UnixStream::connect(&sock).await.unwrap();
    held.write_all(b"GET /v1/tools HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    held.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    let answer = raw_exchange(
        &sock,
        b"GET /v1/tools HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer, "", "second connection was served");
    r.shutdown().await;
}

/// Quotas per minute: three calls a minute, then the fourth waits for the next cell.
#[tokio::test]
async fn a_quota_per_minute_refuses_the_call_beyond_it() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("rate_limits: { per_tool: { per_minute: 3, burst: 3 } }"))
        .await;
    let gw = env.gateway(&r);
    let query = call("memory.query", json!({"query": "x"}));
    for _ in 0..3 {
        let ok = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
        assert_eq!(ok.json()["status"], "ok", "{}", ok.json());
    }
    let refused = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
    assert_error(&refused, StatusCode::OK, "RATE_LIMITED");
    let wait: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((19..=20).contains(&wait), "{wait}");
    r.shutdown().await;
}

/// A tool's rate limit is shared by every caller: a peer refused the tool, calling it again
/// and again, uses none of it, and the peers allowed it get every cell.
#[tokio::test]
async fn a_caller_refused_a_tool_does_not_use_up_its_limit() {
    let env = Env::new().await;
    let peers = json!({"version": 1, "peers": [
        {"component_type": "gateway", "component_id": "gw_test", "role": "gateway",
         "mtls_cert_fingerprint": env.pki.gateway.fingerprint, "status": "active"},
        {"component_type": "subscriber", "component_id": "sub_1",
         "mtls_cert_fingerprint": env.pki.stranger.fingerprint, "status": "active"}
    ]});
    std::fs::write(env.path().join("peers.json"), peers.to_string()).unwrap();
    let r = env
        .start(&env.tools_yaml("rate_limits: { per_tool: { per_minute: 2, burst: 2 } }"))
        .await;
    let query = call("memory.query", json!({"query": "x"}));
    let sub = env.tls_client(&r, Some(&env.pki.stranger), false);
    for _ in 0..4 {
        let refused = sub.post_json("/v1/tools/call", &[], &query).await.unwrap();
        assert_error(&refused, StatusCode::OK, "FORBIDDEN");
    }
    let gw = env.gateway(&r);
    for _ in 0..2 {
        let ok = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
        assert_eq!(ok.json()["status"], "ok", "{}", ok.json());
    }
    let limited = gw.post_json("/v1/tools/call", &[], &query).await.unwrap();
    assert_error(&limited, StatusCode::OK, "RATE_LIMITED");
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;
}
