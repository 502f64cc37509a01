//! What of an MCP server is offered and passed on: static filtering of its tools, its resources
//! and prompts under authorization, and a batched call in a 2025-03-26 session.

use serde_json::json;

use super::common::mcp::{modern, modern_body, python_http_server, start, yaml};
use super::common::{code, Env};
use super::tools_call;

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
