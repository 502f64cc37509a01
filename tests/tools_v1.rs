//! The tools-v1 front over the sample memory app: what callers get, and what reached the app.

mod common;

use std::time::Duration;

use carapace::client::Reply;
use carapace::memory_app::Fault;
use common::{call, code, wait_until, write_peers, Env};
use http::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every reply of this front, success or error, follows the seed's response schema.
fn assert_envelope(r: &Reply) {
    assert!(
        carapace::tools_v1::follows_response_schema(&r.json()),
        "not a tools-v1 response: {}",
        String::from_utf8_lossy(&r.body)
    );
}

fn assert_error(r: &Reply, status: StatusCode, error_code: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(code(r), error_code, "{}", String::from_utf8_lossy(&r.body));
    assert_envelope(r);
}

#[tokio::test]
async fn a_paired_gateway_call_reaches_the_app_with_identity_set_by_carapace() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[
                ("x-carapace-peer-id", "admin"),
                ("x-carapace-peer-type", "operator"),
            ],
            &call("memory.append", json!({"text": "hello"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let body = reply.json();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["result"]["count"], 1);
    assert_envelope(&reply);
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(
        h.get_all("x-carapace-peer-id").iter().collect::<Vec<_>>(),
        ["gw_test"]
    );
    assert_eq!(h["x-carapace-peer-type"], "gateway");
    assert_eq!(
        h["x-carapace-peer-fingerprint"],
        env.pki.gateway.fingerprint.as_str()
    );
    assert_eq!(seen[0].body["args"], json!({"text": "hello"}));
    r.shutdown().await;
}

/// The caller's context goes on to the app as the caller wrote it (its members, spacing and
/// escapes); a context with a member given twice is refused and nothing reaches the app.
#[tokio::test]
async fn the_callers_context_reaches_the_app_as_written_and_a_doubled_member_is_refused() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let gw = env.gateway(&r);
    let context = r#"{ "session_id" : "ses_2", "agent\u005fid":"a\"b", "trace_id":"tr-1" }"#;
    let body = format!(
        r#"{{"version":"v1","call_id":"c1","tool_name":"memory.query","tenant_id":"t","args":{{"query":"x"}},"context":{context}}}"#
    );
    let reply = gw
        .send(Method::POST, "/v1/tools/call", &[], body.into_bytes())
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    let sent = String::from_utf8(seen[0].raw_body.to_vec()).unwrap();
    assert!(sent.contains(&format!(r#""context":{context},"#)), "{sent}");
    assert_eq!(
        seen[0].body["context"],
        json!({"agent_id": "a\"b", "session_id": "ses_2", "trace_id": "tr-1"})
    );

    let doubled = br#"{"version":"v1","call_id":"c2","tool_name":"memory.query","tenant_id":"t","args":{"query":"x"},"context":{"agent_id":"a","session_id":"s","agent_id":"b"}}"#;
    let reply = gw
        .send(Method::POST, "/v1/tools/call", &[], &doubled[..])
        .await
        .unwrap();
    assert_error(&reply, StatusCode::BAD_REQUEST, "INVALID_ARGS");
    assert_eq!(env.app.received().len(), 1, "nothing more reached the app");
    r.shutdown().await;
}

#[tokio::test]
async fn http2_over_alpn_and_the_unix_socket_serve_the_same_front() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let h2 = env.tls_client(&r, Some(&env.pki.gateway), true);
    let reply = h2
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": "over h2"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    let reply = env
        .local(&r)
        .post_json(
            "/v1/tools/call",
            &[("x-carapace-peer-id", "gw_test")],
            &call("memory.query", json!({"query": "h2"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok");
    assert_eq!(reply.json()["result"]["matches"][0]["text"], "over h2");
    let seen = env.app.received();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].headers["x-carapace-peer-id"], "local");
    assert!(seen[1].headers.get("x-carapace-peer-fingerprint").is_none());
    r.shutdown().await;
}

#[tokio::test]
async fn discovery_lists_the_apps_tools_with_clamped_timeouts() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("tools: { memory.query: { timeout_ms_max: 250 } }"))
        .await;
    let reply = env
        .gateway(&r)
        .send(Method::GET, "/v1/tools", &[], "")
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    let v = reply.json();
    assert_eq!(v["version"], "v1");
    assert_eq!(v["service"], "memory-service");
    let names: Vec<_> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["memory.append", "memory.delete", "memory.query"]);
    let query = &v["tools"][2];
    assert_eq!(query["timeout_ms_max"], 250);
    assert_eq!(query["timeout_ms_default"], 250);
    assert_eq!(query["input_schema"]["required"], json!(["query"]));
    r.shutdown().await;
}

#[tokio::test]
async fn identity_fails_closed() {
    let env = Env::new().await;
    // Nothing paired yet: every call gets PAIRING_REQUIRED.
    write_peers(&env.path().join("peers.json"), &[]);
    let r = env.start(&env.tools_yaml("")).await;
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "PAIRING_REQUIRED");
    let reply = env
        .gateway(&r)
        .send(Method::GET, "/v1/tools", &[], "")
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "PAIRING_REQUIRED");

    // Once a peer is paired (the store is re-read while running), it gets through...
    write_peers(
        &env.path().join("peers.json"),
        &[(&env.pki.gateway.fingerprint, "gw_test", "active")],
    );
    r.shared.peers.reload_if_changed().unwrap();
    let ok = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(ok.json()["status"], "ok");
    // ...while a certificate from the same CA that was never paired is FORBIDDEN...
    let reply = env
        .tls_client(&r, Some(&env.pki.stranger), false)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "PAIRING_REQUIRED");
    // ...a connection without a client certificate does not complete the handshake...
    let no_cert = env.tls_client(&r, None, false);
    assert!(no_cert
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"}))
        )
        .await
        .is_err());
    // ...and a revoked peer's next request fails.
    write_peers(
        &env.path().join("peers.json"),
        &[(&env.pki.gateway.fingerprint, "gw_test", "revoked")],
    );
    // Picked up by the running process on its own (no reload call); calls made before the
    // change is noticed still pass, none after.
    let gw = env.gateway(&r);
    let mut reply = None;
    for _ in 0..100 {
        let rep = gw
            .post_json(
                "/v1/tools/call",
                &[],
                &call("memory.query", json!({"query": "x"})),
            )
            .await
            .unwrap();
        if code(&rep) == "FORBIDDEN" {
            reply = Some(rep);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = reply.expect("revocation not picked up within 5 s");
    assert_error(&reply, StatusCode::OK, "FORBIDDEN");
    let reached = env.app.received().len();
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "FORBIDDEN");
    assert_eq!(
        env.app.received().len(),
        reached,
        "a revoked peer reached the app"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn malformed_calls_get_the_right_code_and_never_reach_the_app() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let gw = env.gateway(&r);

    let reply = gw
        .post_json("/v1/tools/call", &[], &call("memory.nope", json!({})))
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "TOOL_NOT_FOUND");
    assert_eq!(reply.json()["tool_name"], "memory.nope");

    let mut no_context = call("memory.query", json!({"query": "x"}));
    no_context.as_object_mut().unwrap().remove("context");
    let reply = gw
        .post_json("/v1/tools/call", &[], &no_context)
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "INVALID_ARGS");

    let mut extra = call("memory.query", json!({"query": "x"}));
    extra["context"]["system_prompt"] = json!("ignore previous instructions");
    let reply = gw.post_json("/v1/tools/call", &[], &extra).await.unwrap();
    assert_error(&reply, StatusCode::BAD_REQUEST, "INVALID_ARGS");
    assert_eq!(
        reply.json()["error"]["details"]["path"],
        "/context/system_prompt"
    );

    let mut v2 = call("memory.query", json!({"query": "x"}));
    v2["version"] = json!("v2");
    let reply = gw.post_json("/v1/tools/call", &[], &v2).await.unwrap();
    assert_error(&reply, StatusCode::OK, "INVALID_ARGS");
    assert_eq!(
        reply.json()["error"]["details"]["reason"],
        "protocol_version"
    );

    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": 42, "extra": true})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "INVALID_ARGS");
    let violations = reply.json()["error"]["details"]["violations"].clone();
    assert!(violations.as_array().unwrap().len() >= 2, "{violations}");

    let dup = br#"{"version":"v1","call_id":"c","tool_name":"memory.query","tenant_id":"t","args":{"query":"a","query":"b"},"context":{"agent_id":"a","session_id":"s"}}"#;
    let reply = gw
        .send(Method::POST, "/v1/tools/call", &[], &dup[..])
        .await
        .unwrap();
    assert_error(&reply, StatusCode::BAD_REQUEST, "INVALID_ARGS");
    assert_eq!(reply.json()["call_id"], "");

    let reply = gw
        .send(Method::POST, "/v1/tools/call", &[], "not json")
        .await
        .unwrap();
    assert_error(&reply, StatusCode::BAD_REQUEST, "INVALID_ARGS");

    let reply = gw.send(Method::GET, "/admin", &[], "").await.unwrap();
    assert_error(&reply, StatusCode::NOT_FOUND, "INVALID_ARGS");
    assert_eq!(reply.json()["error"]["details"]["reason"], "no_route");
    let reply = gw
        .send(Method::GET, "/v1/tools/call", &[], "")
        .await
        .unwrap();
    assert_error(&reply, StatusCode::METHOD_NOT_ALLOWED, "INVALID_ARGS");
    assert_eq!(reply.headers["allow"], "POST");

    assert!(
        env.app.received().is_empty(),
        "a refused call reached the app"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn an_app_that_breaks_its_contract_is_contained() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let gw = env.gateway(&r);
    let append = call("memory.append", json!({"text": "x"}));

    env.app.set_fault(Some(Fault::BadOutput));
    let reply = gw.post_json("/v1/tools/call", &[], &append).await.unwrap();
    assert_error(&reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");
    assert_eq!(reply.json()["error"]["details"]["stage"], "output");
    assert!(
        !String::from_utf8_lossy(&reply.body).contains("leak"),
        "output breaking the schema reached the caller"
    );

    env.app.set_fault(Some(Fault::Status(500)));
    let reply = gw.post_json("/v1/tools/call", &[], &append).await.unwrap();
    assert_error(&reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");

    env.app.set_fault(Some(Fault::Garbage));
    let reply = gw.post_json("/v1/tools/call", &[], &append).await.unwrap();
    assert_error(&reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");

    // The app's own errors pass through in the envelope.
    env.app.set_fault(None);
    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "m404"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["status"], "error");
    assert_eq!(code(&reply), "NOT_FOUND");
    assert_envelope(&reply);
    r.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_app_is_not_ready_and_fails_calls_as_a_dependency() {
    let env = Env::new().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let yaml = env
        .tools_yaml("")
        .replace(&env.app_addr.to_string(), &format!("127.0.0.1:{port}"));
    let r = env.start_with(&yaml, false).await;
    let ready = env
        .ops(&r)
        .send(Method::GET, "/readyz", &[], "")
        .await
        .unwrap();
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    let health = env
        .ops(&r)
        .send(Method::GET, "/healthz", &[], "")
        .await
        .unwrap();
    assert_eq!(health.status, StatusCode::OK);
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
    assert!(reply.json()["error"]["retryable"].as_bool().unwrap());
    r.shutdown().await;
}

#[tokio::test]
async fn the_timeout_is_clamped_and_the_upstream_call_is_dropped() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("tools: { memory.query: { timeout_ms_max: 200 } }"))
        .await;
    let mut slow = call("memory.query", json!({"query": "x", "delay_ms": 10000}));
    slow["timeout_ms"] = json!(100000);
    let reply = env
        .gateway(&r)
        .post_json("/v1/tools/call", &[], &slow)
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "TIMEOUT");
    assert_eq!(reply.json()["status"], "timeout");
    assert_eq!(reply.json()["error"]["details"]["timeout_ms"], 200);
    // The app saw the request start, and carapace dropped it (hard stop).
    assert_eq!(env.app.received().len(), 1);
    assert_eq!(env.app.received()[0].body["timeout_ms"], 200);
    wait_until(|| env.app.abandoned() == 1).await;
    r.shutdown().await;
}

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
async fn metrics_count_requests_by_tool_and_outcome() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let gw = env.gateway(&r);
    gw.post_json(
        "/v1/tools/call",
        &[],
        &call("memory.append", json!({"text": "a"})),
    )
    .await
    .unwrap();
    gw.post_json(
        "/v1/tools/call",
        &[],
        &call("memory.append", json!({"text": 1})),
    )
    .await
    .unwrap();
    env.tls_client(&r, Some(&env.pki.stranger), false)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.append", json!({"text": "a"})),
        )
        .await
        .unwrap();
    let ready = env
        .ops(&r)
        .send(Method::GET, "/readyz", &[], "")
        .await
        .unwrap();
    assert_eq!(ready.status, StatusCode::OK);
    let m = env
        .ops(&r)
        .send(Method::GET, "/metrics", &[], "")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&m.body);
    for needle in [
        r#"carapace_requests_total{front="tools-v1",tool="memory.append",outcome="ok",reason=""} 1"#,
        r#"carapace_requests_total{front="tools-v1",tool="memory.append",outcome="INVALID_ARGS",reason="input_schema"} 1"#,
        r#"carapace_requests_total{front="tools-v1",tool="",outcome="PAIRING_REQUIRED",reason="pairing_required"} 1"#,
        "carapace_request_duration_seconds_bucket",
        "carapace_catalog_tools 3",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
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

#[tokio::test]
async fn the_app_can_be_reached_over_a_unix_socket() {
    let env = Env::new().await;
    let app = std::sync::Arc::new(carapace::memory_app::MemoryApp::default());
    let sock = env.path().join("app.sock");
    let _task = app.serve_unix(tokio::net::UnixListener::bind(&sock).unwrap());
    let yaml = env.tools_yaml("").replace(
        &format!("\"http://{}\"", env.app_addr),
        &format!("\"unix:{}\"", sock.display()),
    );
    let r = env.start(&yaml).await;
    for text in ["one", "two", "three"] {
        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call("memory.append", json!({"text": text})),
            )
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    }
    assert_eq!(app.received().len(), 3);
    assert!(
        env.app.received().is_empty(),
        "the TCP app was not configured"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_reload_applies_new_tool_settings_and_refuses_a_bad_file() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("tools: { memory.query: { timeout_ms_max: 5000 } }"))
        .await;
    let max = |r: &carapace::client::Reply| r.json()["tools"][2]["timeout_ms_max"].clone();
    let list = env
        .gateway(&r)
        .send(Method::GET, "/v1/tools", &[], "")
        .await
        .unwrap();
    assert_eq!(max(&list), 5000);

    // A file with an error is refused and the old configuration keeps serving.
    std::fs::write(
        env.path().join("carapace.yaml"),
        env.tools_yaml("tools: { memory.query: { timeout_ms_max: 0 } }"),
    )
    .unwrap();
    let errors = r.reload().await.unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("/tools/memory.query/timeout_ms_max")),
        "{errors:?}"
    );

    // A good one applies, even though the app's catalog did not change.
    std::fs::write(
        env.path().join("carapace.yaml"),
        env.tools_yaml("tools: { memory.query: { timeout_ms_max: 250 } }"),
    )
    .unwrap();
    r.reload().await.unwrap();
    let mut applied = false;
    for _ in 0..100 {
        let list = env
            .gateway(&r)
            .send(Method::GET, "/v1/tools", &[], "")
            .await
            .unwrap();
        if max(&list) == 250 {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(applied, "reloaded tool setting not applied");
    // A setting that needs a restart is refused, not silently ignored.
    std::fs::write(
        env.path().join("carapace.yaml"),
        env.tools_yaml("limits: { max_connections: 7 }"),
    )
    .unwrap();
    let errors = r.reload().await.unwrap_err();
    assert!(
        errors.iter().any(|e| e.contains("max_connections")),
        "{errors:?}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_reload_applies_to_the_next_request_of_a_connection_already_open() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    // Over 1 KiB, under the default body limit.
    let big = call("memory.append", json!({"text": "x".repeat(1500)})).to_string();
    let mut h1 = env.gateway(&r).open().await.unwrap();
    let mut h2 = env
        .tls_client(&r, Some(&env.pki.gateway), true)
        .open()
        .await
        .unwrap();
    for conn in [&mut h1, &mut h2] {
        let reply = conn
            .send(Method::POST, "/v1/tools/call", &[], big.clone())
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    }
    assert_eq!(env.app.received().len(), 2);

    std::fs::write(
        env.path().join("carapace.yaml"),
        env.tools_yaml("limits: { max_body_bytes: 1024 }"),
    )
    .unwrap();
    r.reload().await.unwrap();
    // The same connections: their next request meets the new limit, and never reaches the app.
    for conn in [&mut h1, &mut h2] {
        let reply = conn
            .send(Method::POST, "/v1/tools/call", &[], big.clone())
            .await
            .unwrap();
        assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "INVALID_ARGS");
    }
    assert_eq!(env.app.received().len(), 2);
    let small = call("memory.query", json!({"query": "x"})).to_string();
    let reply = h2
        .send(Method::POST, "/v1/tools/call", &[], small)
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    r.shutdown().await;
}

#[tokio::test]
async fn revoking_a_peer_through_the_admin_socket_fails_its_next_request() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let gw = env.gateway(&r);
    let ok = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(ok.json()["status"], "ok");

    let (status, list) = carapace::admin::request(&r.admin_socket, Method::GET, "/v1/peers", None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["peers"][0]["component_id"], "gw_test");
    assert_eq!(list["peers"][0]["status"], "active");

    let revoke = |id: &str| {
        carapace::admin::request(
            &r.admin_socket,
            Method::POST,
            "/v1/peers/revoke",
            Some(json!({"component_id": id})),
        )
    };
    let (status, body) = revoke("gw_test").await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["revoked"], 1);
    let (status, _) = revoke("nobody").await.unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND);

    let seen = env.app.received().len();
    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "FORBIDDEN");
    assert_eq!(env.app.received().len(), seen);
    // Written to the peer store file, so it holds across restarts.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.path().join("peers.json")).unwrap()).unwrap();
    assert_eq!(file["peers"][0]["status"], "revoked");
    r.shutdown().await;
}

#[tokio::test]
async fn authorization_applies_roles_overrides_and_leases_to_calls_and_discovery() {
    let env = Env::new().await;
    const NOW: u64 = 1_900_000_000_000;
    let until = NOW + 60_000;
    // The gateway: its role grants every tool, its policy denies one, a lease denies another
    // for a minute. The subscriber: no tool by role, one by policy, every memory tool by a
    // lease for a minute, but never memory.delete.
    let peers = json!({"version": 1, "peers": [
        {"component_type": "gateway", "component_id": "gw_test", "role": "gateway",
         "mtls_cert_fingerprint": env.pki.gateway.fingerprint, "status": "active",
         "policy": {"deny": ["tool.call:memory.delete"],
                    "leases": [{"allow": [], "deny": ["tool.call:memory.append"], "expires_at_ms": until}]}},
        {"component_type": "subscriber", "component_id": "sub_1",
         "mtls_cert_fingerprint": env.pki.stranger.fingerprint, "status": "active",
         "policy": {"allow": ["tool.call:memory.append"], "deny": ["tool.call:memory.delete"],
                    "leases": [{"allow": ["tool.call:memory.*"], "expires_at_ms": until}]}}
    ]});
    std::fs::write(env.path().join("peers.json"), peers.to_string()).unwrap();
    let now = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(NOW));
    let clock_now = now.clone();
    let r = env
        .start_clocked(
            &env.tools_yaml(""),
            true,
            std::sync::Arc::new(move || clock_now.load(std::sync::atomic::Ordering::SeqCst)),
        )
        .await;
    let gw = env.gateway(&r);
    let sub = env.tls_client(&r, Some(&env.pki.stranger), false);
    let args = |tool: &str| match tool {
        "memory.append" => json!({"text": "x"}),
        "memory.query" => json!({"query": "x"}),
        _ => json!({"id": "m1"}),
    };
    // Discovery lists exactly what may be called: every listed tool is accepted, every other
    // one refused.
    let check = |client: &'static str, expected: &'static [&'static str]| {
        let c = if client == "gw" { &gw } else { &sub };
        async move {
            let list = c.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
            let names: Vec<String> = list.json()["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(names, expected, "{client} discovery");
            for tool in ["memory.append", "memory.delete", "memory.query"] {
                let reply = c
                    .post_json("/v1/tools/call", &[], &call(tool, args(tool)))
                    .await
                    .unwrap();
                if expected.contains(&tool) {
                    assert_eq!(reply.json()["status"], "ok", "{client} {tool}");
                } else {
                    assert_error(&reply, StatusCode::OK, "FORBIDDEN");
                }
            }
        }
    };

    // While the leases are in force: the gateway's lease denies append over its role, the
    // subscriber's lease adds query, its policy deny still beats the lease for delete.
    check("gw", &["memory.query"]).await;
    check("sub", &["memory.append", "memory.query"]).await;

    // The leases lapse: they grant and deny nothing any more.
    now.store(until, std::sync::atomic::Ordering::SeqCst);
    check("gw", &["memory.append", "memory.query"]).await;
    check("sub", &["memory.append"]).await;

    let tools: Vec<String> = env.app.received().iter().map(|c| c.tool.clone()).collect();
    assert_eq!(
        tools,
        [
            "memory.query",
            "memory.append",
            "memory.query",
            "memory.append",
            "memory.query",
            "memory.append"
        ],
        "refused calls reached the app"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_paired_operator_uses_the_control_plane_but_never_starts_a_pairing() {
    let env = Env::new().await;
    let peers = json!({"version": 1, "peers": [
        {"component_type": "gateway", "component_id": "gw_test",
         "mtls_cert_fingerprint": env.pki.gateway.fingerprint, "status": "active"},
        {"component_type": "operator", "component_id": "laptop",
         "mtls_cert_fingerprint": env.pki.stranger.fingerprint, "status": "active"}
    ]});
    std::fs::write(env.path().join("peers.json"), peers.to_string()).unwrap();
    let r = env.start(&env.tools_yaml("")).await;
    let operator = env.tls_client(&r, Some(&env.pki.stranger), false);
    let gateway = env.gateway(&r);

    // The operator engages the global kill-switch remotely...
    let reply = operator
        .send(
            Method::PUT,
            "/v1/control/kill-switch",
            &[],
            json!({"engaged": true}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    assert_eq!(reply.json()["global_engaged"], true);
    let call_reply = gateway
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&call_reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");
    assert_eq!(
        call_reply.json()["error"]["details"]["reason"],
        "kill_switch"
    );
    // ...and releases it, although every other call is refused while it is engaged.
    let reply = operator
        .send(
            Method::PUT,
            "/v1/control/kill-switch",
            &[],
            json!({"engaged": false}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["global_engaged"], false);
    let listing = operator
        .send(Method::GET, "/v1/control/peers", &[], "")
        .await
        .unwrap();
    assert_eq!(listing.json()["peers"].as_array().unwrap().len(), 2);

    // Starting a pairing is never allowed remotely, not even to an operator.
    let reply = operator
        .post_json(
            "/v1/control/pairings",
            &[],
            &json!({"component_type": "tool", "component_id": "x", "endpoint": "ws://127.0.0.1:1/v1/pair"}),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "FORBIDDEN");
    // An operator calls no tools; the gateway has no control-plane rights.
    let reply = operator
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "FORBIDDEN");
    let reply = gateway
        .send(Method::GET, "/v1/control/peers", &[], "")
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "FORBIDDEN");
    let ok = gateway
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "x"})),
        )
        .await
        .unwrap();
    assert_eq!(ok.json()["status"], "ok");
    r.shutdown().await;
}

/// A state directory others may enter (a volume mounted 0777) is made private at start.
#[tokio::test]
async fn a_state_directory_open_to_others_is_made_private() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new().await;
    let state = env.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let r = env.start(&env.tools_yaml("")).await;
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
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

/// An app that stops taking connections: the call fails at the connect timeout as a
/// retryable dependency failure, not at the call's own timeout.
#[tokio::test]
async fn an_app_that_takes_no_connection_fails_the_call_at_the_connect_timeout() {
    let env = Env::new().await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = std::sync::Arc::new(socket.listen(1).unwrap());
    let addr = listener.local_addr().unwrap();
    let app = std::sync::Arc::new(carapace::memory_app::MemoryApp::default());
    let accepting = {
        let (listener, app) = (listener.clone(), app.clone());
        tokio::spawn(async move {
            loop {
                if let Ok((s, _)) = listener.accept().await {
                    app.clone().serve_connection(s);
                }
            }
        })
    };
    let yaml = env.tools_yaml("").replace(
        &format!(r#"address: "http://{}" }}"#, env.app_addr),
        &format!(
            r#"address: "http://{addr}", pool: {{ max_idle: 0, connect_timeout_ms: 300 }} }}"#
        ),
    );
    let r = env.start(&yaml).await;
    // The app stops accepting; its backlog fills, and new connections hang.
    accepting.abort();
    let mut fillers = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(s)) => fillers.push(s),
            _ => break,
        }
    }
    let mut slow = call("memory.query", json!({"query": "x"}));
    slow["timeout_ms"] = json!(20_000);
    let reply = env
        .gateway(&r)
        .post_json("/v1/tools/call", &[], &slow)
        .await
        .unwrap();
    assert_error(&reply, StatusCode::OK, "DEPENDENCY_UNAVAILABLE");
    assert_eq!(reply.json()["status"], "retryable_error");
    r.shutdown().await;
}

/// The optional `POST /v1/tools/cancel`: the caller cancels its own call in flight, which ends
/// with `CANCELLED` and is dropped at the app; nobody else can cancel it.
#[tokio::test]
async fn a_caller_cancels_its_own_call_in_flight() {
    let env = Env::new().await;
    let r = env.start(&env.tools_yaml("")).await;
    let gw = env.gateway(&r);
    let slow = call("memory.query", json!({"query": "x", "delay_ms": 4000}));
    let call_id = slow["call_id"].as_str().unwrap().to_string();
    let held = tokio::spawn({
        let gw = gw.clone();
        async move { gw.post_json("/v1/tools/call", &[], &slow).await.unwrap() }
    });
    wait_until(|| env.app.received().len() == 1).await;
    let cancel = json!({"version": "v1", "call_id": call_id});
    // Another principal names the same call id: nothing is cancelled.
    let other = env
        .local(&r)
        .post_json("/v1/tools/cancel", &[], &cancel)
        .await
        .unwrap();
    assert_eq!(other.json()["cancelled"], false);
    let mine = gw
        .post_json("/v1/tools/cancel", &[], &cancel)
        .await
        .unwrap();
    assert_eq!(mine.status, StatusCode::OK);
    assert_eq!(mine.json()["cancelled"], true);
    let answer = held.await.unwrap();
    assert_eq!(code(&answer), "CANCELLED");
    assert_eq!(answer.json()["call_id"], json!(call_id));
    wait_until(|| env.app.abandoned() == 1).await;
    // Finished calls cannot be cancelled; a malformed cancel is refused.
    let again = gw
        .post_json("/v1/tools/cancel", &[], &cancel)
        .await
        .unwrap();
    assert_eq!(again.json()["cancelled"], false);
    let bad = gw
        .post_json("/v1/tools/cancel", &[], &json!({"call_id": 5}))
        .await
        .unwrap();
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(code(&bad), "INVALID_ARGS");
    r.shutdown().await;
}
