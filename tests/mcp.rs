//! The MCP front, both protocol eras, through carapace in front of the memory app.

mod common;

use common::mcp::{error_code, front_yaml, modern, modern_body, post, start_front, MODERN};
use common::Env;
use http::{Method, StatusCode};
use serde_json::{json, Value};

#[tokio::test]
async fn a_modern_client_discovers_lists_and_calls() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let gw = env.gateway(&r);

    let d = modern(&gw, &modern_body(1, "server/discover", json!({}))).await;
    assert_eq!(d.status, StatusCode::OK);
    let result = &d.json()["result"];
    assert_eq!(result["supportedVersions"][0], MODERN);
    assert_eq!(result["resultType"], "complete");
    assert!(result["ttlMs"].is_u64());
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "carapace"
    );

    let l = modern(&gw, &modern_body(2, "tools/list", json!({}))).await;
    let tools = l.json()["result"]["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(
        names.contains(&"memory.append") && names.contains(&"memory.query"),
        "{names:?}"
    );
    assert!(names.windows(2).all(|w| w[0] < w[1]), "deterministic order");
    assert!(tools.iter().all(|t| t["inputSchema"]["type"] == "object"));
    assert!(["public", "private"].contains(&l.json()["result"]["cacheScope"].as_str().unwrap()));

    let call = modern_body(
        3,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": "hello"}}),
    );
    let c = modern(&gw, &call).await;
    assert_eq!(c.status, StatusCode::OK);
    let result = &c.json()["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert!(result["structuredContent"].is_object(), "{result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        result["structuredContent"]
    );
    assert_eq!(env.app.received().len(), 1);
    assert_eq!(env.app.received()[0].body["args"], json!({"text": "hello"}));
}

#[tokio::test]
async fn bad_arguments_come_back_as_a_tool_error_and_never_reach_the_app() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let gw = env.gateway(&r);
    let call = modern_body(
        1,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": 5}}),
    );
    let c = modern(&gw, &call).await;
    assert_eq!(c.status, StatusCode::OK);
    let result = &c.json()["result"];
    assert_eq!(result["isError"], true);
    assert_eq!(
        result["_meta"]["dev.carapace/error"]["code"],
        "INVALID_ARGS"
    );
    assert!(result["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("INVALID_ARGS"));

    let unknown = modern_body(
        2,
        "tools/call",
        json!({"name": "memory.nope", "arguments": {}}),
    );
    let u = modern(&gw, &unknown).await;
    assert_eq!(error_code(&u), -32602);
    assert_eq!(u.json()["id"], 2);
    assert!(env.app.received().is_empty());
}

#[tokio::test]
async fn headers_must_agree_with_the_body_and_metadata_is_required() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let gw = env.gateway(&r);
    let call = modern_body(
        1,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": "x"}}),
    );
    let h = |name: &str| {
        vec![
            ("mcp-protocol-version", MODERN.to_string()),
            ("mcp-method", "tools/call".to_string()),
            ("mcp-name", name.to_string()),
        ]
    };
    // The header names another tool than the body: refused, nothing forwarded.
    let mismatch = post(&gw, &call, &h("memory.query")).await;
    assert_eq!(mismatch.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&mismatch), -32020);
    // The base64 form of the right name is the right name.
    let encoded = post(&gw, &call, &h("=?base64?bWVtb3J5LmFwcGVuZA==?=")).await;
    assert_eq!(
        encoded.json()["result"]["isError"],
        false,
        "{:?}",
        encoded.json()
    );
    // A missing Mcp-Method.
    let no_method = post(&gw, &call, &[("mcp-protocol-version", MODERN.to_string())]).await;
    assert_eq!(error_code(&no_method), -32020);
    // The version header disagrees with `_meta`.
    let mut v = h("memory.append");
    v[0].1 = "2025-11-25".into();
    assert_eq!(error_code(&post(&gw, &call, &v).await), -32020);
    // No client capabilities.
    let mut bare = call.clone();
    bare["params"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    let missing = post(&gw, &bare, &h("memory.append")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&missing), -32602);
    // An unsupported version, with the supported list.
    let mut old = call.clone();
    old["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("1900-01-01");
    let mut hv = h("memory.append");
    hv[0].1 = "1900-01-01".into();
    let unsupported = post(&gw, &old, &hv).await;
    assert_eq!(unsupported.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&unsupported), -32022);
    assert_eq!(
        unsupported.json()["error"]["data"]["requested"],
        "1900-01-01"
    );
    assert_eq!(unsupported.json()["error"]["data"]["supported"][0], MODERN);
    // Unknown method: 404 and -32601.
    let nope = modern(&gw, &modern_body(9, "resources/list", json!({}))).await;
    assert_eq!(nope.status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&nope), -32601);
    assert_eq!(
        env.app.received().len(),
        1,
        "only the encoded-name call reached the app"
    );
}

#[tokio::test]
async fn initialize_and_ping_do_not_exist_in_2026_07_28_but_ping_does_in_a_session() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let gw = env.gateway(&r);
    for method in ["initialize", "ping"] {
        let removed = modern(&gw, &modern_body(1, method, json!({}))).await;
        assert_eq!(removed.status, StatusCode::NOT_FOUND, "{method}");
        assert_eq!(error_code(&removed), -32601, "{method}");
        assert_eq!(removed.json()["id"], 1);
        assert!(removed.headers.get("mcp-session-id").is_none());
    }
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}}});
    let i = post(&gw, &init, &[]).await;
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let p = post(&gw, &ping, &[("mcp-session-id", session)]).await;
    assert_eq!(p.status, StatusCode::OK);
    assert_eq!(p.json()["result"], json!({}));
}

#[tokio::test]
async fn a_legacy_client_initializes_a_session_and_calls_in_it() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let gw = env.gateway(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let i = post(&gw, &init, &[]).await;
    assert_eq!(i.json()["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(i.json()["result"]["serverInfo"]["name"], "carapace");
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    let in_session = |v: &str| {
        vec![
            ("mcp-session-id", session.clone()),
            ("mcp-protocol-version", v.to_string()),
        ]
    };
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(
        post(&gw, &note, &in_session("2025-06-18")).await.status,
        StatusCode::ACCEPTED
    );

    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let l = post(&gw, &list, &in_session("2025-06-18")).await;
    assert!(l.json()["result"]["tools"].as_array().unwrap().len() >= 2);
    assert!(
        l.json()["result"].get("ttlMs").is_none(),
        "no cache hints before 2026-07-28"
    );

    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "memory.append", "arguments": {"text": "hi"}}});
    let c = post(&gw, &call, &in_session("2025-06-18")).await;
    assert_eq!(c.json()["result"]["isError"], false, "{:?}", c.json());
    assert!(c.json()["result"].get("resultType").is_none());

    // Another handshake revision in the header is served at the session's (the SDKs send
    // 2025-03-26 there); one carapace does not serve is refused. No session at all; a forged one.
    let other = post(&gw, &call, &in_session("2025-11-25")).await;
    assert_eq!(
        other.json()["result"]["isError"],
        false,
        "{:?}",
        other.json()
    );
    let wrong = post(&gw, &call, &in_session("2024-11-05")).await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
    let none = post(&gw, &call, &[]).await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    let forged = post(&gw, &call, &[("mcp-session-id", format!("{session}x"))]).await;
    assert_eq!(forged.status, StatusCode::NOT_FOUND);
    // Someone else (the local socket) cannot use it.
    let other = post(&env.local(&r), &call, &in_session("2025-06-18")).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);

    // Batches belong to 2025-03-26 only.
    let batch = json!([list, call]);
    let b = post(&gw, &batch, &in_session("2025-06-18")).await;
    assert_eq!(b.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&b), -32600);
    assert_eq!(b.json()["id"], Value::Null);

    // DELETE ends it.
    let end = gw
        .send(
            Method::DELETE,
            "/mcp",
            &[("mcp-session-id", session.as_str())],
            "",
        )
        .await
        .unwrap();
    assert_eq!(end.status, StatusCode::OK);
    let after = post(&gw, &call, &in_session("2025-06-18")).await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
    assert_eq!(env.app.received().len(), 2, "the two calls in the session");

    // There is no GET stream.
    let get = gw.send(Method::GET, "/mcp", &[], "").await.unwrap();
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn an_unknown_version_in_initialize_gets_the_newest_handshake_version() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let init = json!({"jsonrpc": "2.0", "id": "a", "method": "initialize", "params": {
        "protocolVersion": "2024-01-01", "capabilities": {}}});
    let i = post(&env.local(&r), &init, &[]).await;
    assert_eq!(i.json()["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(i.json()["id"], "a");
}

#[tokio::test]
async fn origins_not_allowed_are_refused_and_pages_follow_cursors() {
    let env = Env::new().await;
    let r = start_front(
        &env,
        r#", mcp: { allowed_origins: ["https://agent.example"], page_size: 1 }"#,
    )
    .await;
    let gw = env.gateway(&r);
    let list = modern_body(1, "tools/list", json!({}));
    let bad = post(
        &gw,
        &list,
        &[
            ("origin", "https://evil.example".to_string()),
            ("mcp-protocol-version", MODERN.to_string()),
            ("mcp-method", "tools/list".to_string()),
        ],
    )
    .await;
    assert_eq!(bad.status, StatusCode::FORBIDDEN);

    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..10 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let l = modern(&gw, &modern_body(page, "tools/list", params)).await;
        let result = l.json()["result"].clone();
        assert_eq!(result["tools"].as_array().unwrap().len(), 1);
        names.push(result["tools"][0]["name"].as_str().unwrap().to_string());
        match result["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(names, sorted);
    assert!(names.len() >= 2);
    let bad_cursor = modern(&gw, &modern_body(99, "tools/list", json!({"cursor": "!!"}))).await;
    assert_eq!(error_code(&bad_cursor), -32602);
}

#[tokio::test]
async fn two_replicas_sharing_the_session_key_serve_one_session() {
    let env = Env::new().await;
    let key = env.path().join("session.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let front = format!(", mcp: {{ session_key: {{ file: {} }} }}", key.display());
    let a = env.start(&front_yaml(&env, &front, "")).await;
    let second = front_yaml(&env, &front, "")
        .replace("/state", "/state_b")
        .replace("/tools.sock", "/tools_b.sock");
    let b = env.start(&second).await;
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}}});
    let i = post(&env.gateway(&a), &init, &[]).await;
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    for (n, replica) in [&b, &a, &b].into_iter().enumerate() {
        let call = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "memory.append", "arguments": {"text": format!("{n}")}}});
        let c = post(
            &env.gateway(replica),
            &call,
            &[("mcp-session-id", session.clone())],
        )
        .await;
        assert_eq!(c.json()["result"]["isError"], false, "{:?}", c.json());
    }
    assert_eq!(env.app.received().len(), 3);
}

/// A session sealed with the shared key at a version this build does not serve (another
/// build's, in a rolling upgrade) cannot be continued: every method answers 404, so that the
/// client starts a new session; nothing reaches the app.
#[tokio::test]
async fn a_session_at_a_version_this_build_does_not_serve_is_not_found() {
    use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
    let env = Env::new().await;
    let key = env.path().join("session.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let front = format!(", mcp: {{ session_key: {{ file: {} }} }}", key.display());
    let r = env.start(&front_yaml(&env, &front, "")).await;
    let gw = env.gateway(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}}});
    let i = post(&gw, &init, &[]).await;
    let served = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    // The same caller's session, sealed with the same key at another version.
    let payload = served.split('.').next().unwrap();
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    let principal = claims["p"].as_str().unwrap();
    let sessions = carapace::mcp::session::Sessions::new(&[7u8; 32], &Default::default());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for version in ["2025-11-25", "2024-11-05"] {
        let session = sessions
            .open(version, principal, Default::default(), now_ms)
            .unwrap();
        let headers = [("mcp-session-id", session)];
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "memory.append", "arguments": {"text": version}}});
        let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
        for body in [&list, &call, &ping] {
            let resp = post(&gw, body, &headers).await;
            if version == "2024-11-05" {
                assert_eq!(
                    resp.status,
                    StatusCode::NOT_FOUND,
                    "{body}: {:?}",
                    resp.json()
                );
                assert_eq!(resp.json()["id"], body["id"], "{:?}", resp.json());
            } else {
                assert_eq!(resp.status, StatusCode::OK, "{body}: {:?}", resp.json());
            }
        }
        // Nor can it be ended.
        let end = gw
            .send(
                Method::DELETE,
                "/mcp",
                &[("mcp-session-id", headers[0].1.as_str())],
                "",
            )
            .await
            .unwrap();
        let ended = if version == "2024-11-05" {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        assert_eq!(end.status, ended, "{version}");
    }
    assert_eq!(
        env.app.received().len(),
        1,
        "only the call in the served session"
    );
}

/// The official Python SDK (`tests/interop/requirements.txt`) over the Unix socket, pinned to
/// each era and in its `auto` mode: tools listed, a good call reaches the app, bad arguments
/// come back as a tool error, an unknown tool is refused.
#[tokio::test]
async fn the_official_python_sdk_lists_and_calls_in_every_era() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let sock = r.unix_path.clone().unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/mcp_python_client.py");
    let modes = ["2026-07-28", "legacy", "auto"];
    for mode in modes {
        let (script, sock) = (script.clone(), sock.clone());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("timeout")
                .arg("60")
                .arg("python3")
                .arg(&script)
                .arg("--uds")
                .arg(&sock)
                .args(["--mode", mode])
                .output()
                .expect("python3 runs")
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
        let negotiated = if mode == "legacy" {
            "2025-11-25"
        } else {
            MODERN
        };
        assert_eq!(seen["protocol_version"], negotiated, "{mode}: {seen}");
        assert!(seen["good"]["structured"].is_object(), "{mode}: {seen}");
        let bad = seen["bad"]["text"][0].as_str().unwrap();
        assert!(bad.starts_with("INVALID_ARGS"), "{mode}: {seen}");
        let unknown = &seen["unknown"];
        assert!(
            unknown["raised"].is_string() || unknown["is_error"] == true,
            "{mode}: {seen}"
        );
    }
    let texts: Vec<Value> = env
        .app
        .received()
        .iter()
        .map(|r| r.body["args"]["text"].clone())
        .collect();
    assert_eq!(
        texts.len(),
        modes.len(),
        "only the good calls reached the app: {texts:?}"
    );
}

/// The MCP front's configuration is checked before anything starts.
#[tokio::test]
async fn mcp_configuration_mistakes_are_refused() {
    let env = Env::new().await;
    let short_key = env.path().join("short.key");
    std::fs::write(&short_key, "too short").unwrap();
    let cases = [
        (
            env.tools_yaml("").replace(
                "front: { protocol: tools-v1 }",
                "front: { protocol: tools-v1, mcp: { path: /mcp } }",
            ),
            "/front/mcp",
        ),
        (
            front_yaml(&env, "", "").replace(
                "app: { protocol: tools-v1,",
                "app: { protocol: tools-v1, command: [node],",
            ),
            "/app/command",
        ),
        (
            front_yaml(&env, "", "").replace(
                "app: { protocol: tools-v1,",
                "app: { protocol: mcp, command: [node],",
            ),
            "/app/address",
        ),
        (
            front_yaml(&env, "", "").replace(
                "app: { protocol: tools-v1,",
                "app: { protocol: tools-v1, env: { A: b },",
            ),
            "/app/env",
        ),
        (
            front_yaml(&env, "", "").replace(
                "app: { protocol: tools-v1,",
                "app: { protocol: tools-v1, mcp: { path: /mcp },",
            ),
            "/app/mcp",
        ),
        (
            front_yaml(
                &env,
                &format!(
                    ", mcp: {{ session_key: {{ file: {} }} }}",
                    short_key.display()
                ),
                "",
            ),
            "/front/mcp/session_key",
        ),
        (
            front_yaml(&env, ", mcp: { path: mcp }", ""),
            "/front/mcp/path",
        ),
        (
            front_yaml(&env, ", mcp: { page_size: 0 }", ""),
            "/front/mcp/page_size",
        ),
    ];
    for (yaml, path) in cases {
        let errors = carapace::config::parse(&yaml, env.path())
            .expect_err(path)
            .0;
        assert!(
            errors.iter().any(|e| e.to_string().contains(path)),
            "{path}: {:?}",
            errors.iter().map(|e| e.to_string()).collect::<Vec<_>>()
        );
    }
}

/// A call in the form the front reads in one pass, and the same call in forms only the
/// general decoding takes (an unknown envelope member, a member given twice: the last one
/// counts), get the same answer; the app receives the arguments each time.
#[tokio::test]
async fn a_call_gets_the_same_answer_whichever_way_its_body_is_read() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let gw = env.gateway(&r);
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let bodies = [
        format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"memory.append","arguments":{{"text":"x"}},{meta}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","extra":[1],"params":{{"name":"memory.append","arguments":{{"text":"x"}},{meta}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"memory.query","name":"memory.append","arguments":{{"text":"y"}},"arguments":{{"text":"x"}},{meta}}}}}"#
        ),
    ];
    assert!(carapace::mcp::wire::read_tools_call(bodies[0].as_bytes()).is_some());
    for body in &bodies[1..] {
        assert!(carapace::mcp::wire::read_tools_call(body.as_bytes()).is_none());
    }
    let headers = [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "tools/call"),
        ("mcp-name", "memory.append"),
    ];
    let mut answers = Vec::new();
    for (n, body) in bodies.iter().enumerate() {
        let reply = gw
            .send(Method::POST, "/mcp", &headers, body.clone())
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{body}");
        let mut answer = reply.json();
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        // The app's answer: the stored entry, one more each time.
        assert_eq!(answer["result"]["structuredContent"]["count"], n + 1);
        answer["result"]["structuredContent"] = Value::Null;
        answer["result"]["content"] = Value::Null;
        answers.push(answer);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], answers[2]);
    let received = env.app.received();
    assert_eq!(received.len(), 3);
    assert!(received
        .iter()
        .all(|c| c.body["args"] == json!({"text": "x"})));
}
