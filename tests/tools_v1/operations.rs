//! Operating the tools-v1 front: metrics, reloads, revoking a peer, authorization, the control
//! plane and the state directory.

use super::*;

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
    // Revoked when the answer came: the next call (each of this client's calls is a
    // connection of its own) is refused.
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
