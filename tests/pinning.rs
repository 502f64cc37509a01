//! Tool-definition pinning: an MCP server (`tests/interop/shifty_mcp_server.py`, whose tools
//! are read from a file at every `tools/list`) changes a tool's schema after carapace pinned it.
//! The tool disappears from the lists and its calls are refused (`FORBIDDEN`, with the changed
//! fields) until it is approved through the admin socket; the change is counted in the
//! metrics. Pins shipped in the configuration approve only what they name.

mod common;

use std::path::Path;
use std::time::Duration;

use carapace::server::Running;
use common::mcp::{interop, json_list, modern, modern_body, start, yaml};
use common::Env;
use http::Method;
use serde_json::{json, Value};

fn write_tools(path: &Path, text_type: &str) {
    let tools = json!([
        {"name": "echo", "description": "Echo the text.",
         "inputSchema": {"type": "object", "properties": {"text": {"type": text_type}}}},
        {"name": "keep", "description": "Never changes.", "inputSchema": {"type": "object"}},
    ]);
    // Written whole, then renamed: the server never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, tools.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The shifty server as the app, with `pinning` (the inside of `pinning: { ... }`, if any).
fn config(env: &Env, tools_file: &Path, pinning: &str) -> String {
    config_with(env, tools_file, pinning, "")
}

/// [`config`], with more of the server's environment (`, NAME: "value"`...).
fn config_with(env: &Env, tools_file: &Path, pinning: &str, server_env: &str) -> String {
    let argv = [
        "python3".to_string(),
        interop("shifty_mcp_server.py").display().to_string(),
    ];
    let path = std::env::var("PATH").unwrap_or_default();
    let mut app = format!(
        "command: {}, env: {{ PATH: \"{path}\", TOOLS_FILE: \"{}\"{server_env} }}",
        json_list(&argv),
        tools_file.display()
    );
    if !pinning.is_empty() {
        app.push_str(&format!(", pinning: {{ {pinning} }}"));
    }
    yaml(env, "mcp", &app)
}

async fn listed(r: &Running, env: &Env) -> Vec<String> {
    let list = modern(&env.local(r), &modern_body(1, "tools/list", json!({}))).await;
    list.json()["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{:?}", list.json()))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn call(r: &Running, env: &Env, tool: &str, text: Value) -> Value {
    let args = json!({"name": tool, "arguments": {"text": text}});
    modern(&env.local(r), &modern_body(2, "tools/call", args))
        .await
        .json()
}

/// Wait (bounded) until `tools/list` is `want`.
async fn until_listed(r: &Running, env: &Env, want: &[&str]) {
    for _ in 0..200 {
        if listed(r, env).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "tools/list never became {want:?}: {:?}",
        listed(r, env).await
    );
}

async fn metrics(r: &Running, env: &Env) -> String {
    let m = env
        .ops(r)
        .send(Method::GET, "/metrics", &[], "")
        .await
        .unwrap();
    String::from_utf8_lossy(&m.body).into_owned()
}

#[tokio::test]
async fn a_changed_tool_is_withheld_and_refused_until_approved() {
    let env = Env::new().await;
    let tools_file = env.path().join("tools.json");
    write_tools(&tools_file, "string");
    let r = start(&env, &config(&env, &tools_file, "")).await;
    assert_eq!(listed(&r, &env).await, ["echo", "keep"]);
    assert!(env.path().join("state/tool-pins.json").exists());

    // The server rewrites `echo` (a "rug pull"); MCP apps are pinned in enforce mode.
    write_tools(&tools_file, "integer");
    until_listed(&r, &env, &["keep"]).await;
    let refused = call(&r, &env, "echo", json!(1)).await;
    let error = &refused["error"]["data"];
    assert_eq!(error["code"], "FORBIDDEN", "{refused}");
    assert_eq!(error["details"]["reason"], "tool_not_approved", "{refused}");
    assert_eq!(
        error["details"]["changed"],
        json!(["/inputSchema/properties/text/type"]),
        "{refused}"
    );
    let kept = call(&r, &env, "keep", json!("hi")).await;
    assert_eq!(
        kept["result"]["content"][0]["text"], "called keep",
        "{kept}"
    );
    let m = metrics(&r, &env).await;
    assert!(m.contains("carapace_tools_withheld 1"), "{m}");
    assert!(
        m.contains(r#"carapace_tool_definition_changes_total{tool="echo"} 1"#),
        "{m}"
    );

    // Approval through the admin socket.
    let sock = r.admin_socket.clone();
    let (status, pins) = carapace::admin::request(&sock, Method::GET, "/v1/tools/pins", None)
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(pins["withheld"]["echo"]["changed"].is_array(), "{pins}");
    let approve = |tool: &str| Some(json!({ "tool": tool }));
    let (status, _) =
        carapace::admin::request(&sock, Method::POST, "/v1/tools/approve", approve("keep"))
            .await
            .unwrap();
    assert_eq!(status, 404, "nothing of `keep` waits for approval");
    let (status, approved) =
        carapace::admin::request(&sock, Method::POST, "/v1/tools/approve", approve("echo"))
            .await
            .unwrap();
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["pin"], pins["withheld"]["echo"]["pin"]);
    until_listed(&r, &env, &["echo", "keep"]).await;
    // The approved definition is the one enforced: `text` is an integer now.
    let called = call(&r, &env, "echo", json!(1)).await;
    assert_eq!(
        called["result"]["content"][0]["text"], "called echo",
        "{called}"
    );
    let old = call(&r, &env, "echo", json!("hi")).await;
    assert_eq!(old["result"]["isError"], true, "{old}");
    r.shutdown().await;

    // The approval is kept: a new process serves the approved definition.
    let r = start(&env, &config(&env, &tools_file, "")).await;
    assert_eq!(listed(&r, &env).await, ["echo", "keep"]);
    r.shutdown().await;
}

#[tokio::test]
async fn configured_pins_approve_only_what_they_name_and_warn_mode_serves_a_change() {
    let env = Env::new().await;
    let tools_file = env.path().join("tools.json");
    write_tools(&tools_file, "string");
    // Learn `keep`'s pin from a first run, then ship only it in the configuration.
    let r = start(&env, &config(&env, &tools_file, "")).await;
    let (_, pins) = carapace::admin::request(&r.admin_socket, Method::GET, "/v1/tools/pins", None)
        .await
        .unwrap();
    r.shutdown().await;
    let keep = pins["pins"]["keep"].as_str().unwrap().to_owned();
    let r = start(
        &env,
        &config(&env, &tools_file, &format!("pins: {{ keep: \"{keep}\" }}")),
    )
    .await;
    assert_eq!(listed(&r, &env).await, ["keep"]);
    let refused = call(&r, &env, "echo", json!("hi")).await;
    assert_eq!(
        refused["error"]["data"]["details"]["changed"],
        json!(["(not pinned)"])
    );
    let (status, _) = carapace::admin::request(
        &r.admin_socket,
        Method::POST,
        "/v1/tools/approve",
        Some(json!({"tool": "echo"})),
    )
    .await
    .unwrap();
    assert_eq!(status, 409, "pins in the configuration are changed there");
    // So: the pin of `echo` added to the configuration and reloaded approves it.
    let (_, now) = carapace::admin::request(&r.admin_socket, Method::GET, "/v1/tools/pins", None)
        .await
        .unwrap();
    let echo = now["withheld"]["echo"]["pin"].as_str().unwrap().to_owned();
    let pins = format!("pins: {{ keep: \"{keep}\", echo: \"{echo}\" }}");
    std::fs::write(
        env.path().join("carapace.yaml"),
        config(&env, &tools_file, &pins),
    )
    .unwrap();
    carapace::ops::reload::reload(&r.shared).await.unwrap();
    until_listed(&r, &env, &["echo", "keep"]).await;
    r.shutdown().await;

    // warn: a change is reported and the tool still served.
    let r = start(&env, &config(&env, &tools_file, "mode: warn")).await;
    write_tools(&tools_file, "boolean");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(listed(&r, &env).await, ["echo", "keep"]);
    let m = metrics(&r, &env).await;
    assert!(
        m.contains(r#"carapace_tool_definition_changes_total{tool="echo"} 1"#),
        "{m}"
    );
    r.shutdown().await;
}

#[test]
fn a_malformed_pin_is_a_configuration_error() {
    let env_dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "state_dir: {d}/state\nfront: {{ protocol: mcp }}\nlisteners: {{ unix: {{ path: {d}/s.sock }} }}\n\
         app: {{ protocol: mcp, command: [x], pinning: {{ pins: {{ a: \"md5:00\" }}, file: {d}/missing.json }} }}\n",
        d = env_dir.path().display()
    );
    let errors = carapace::config::parse(&yaml, env_dir.path()).unwrap_err();
    let paths: Vec<&str> = errors.0.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"/app/pinning/pins/a"), "{paths:?}");
    assert!(paths.contains(&"/app/pinning/file"), "{paths:?}");
}

/// A server that floods `tools/list_changed` (200 notices over about a second) gets its first
/// notice acted on at once and the rest at most once a second: a few discoveries, not one per
/// notice.
#[tokio::test]
async fn a_flood_of_list_changed_notices_discovers_at_most_once_a_second() {
    let env = Env::new().await;
    let tools_file = env.path().join("tools.json");
    write_tools(&tools_file, "string");
    let lists = env.path().join("lists.txt");
    let server_env = format!(", NOTICES: \"200\", LISTS_FILE: \"{}\"", lists.display());
    let r = start(&env, &config_with(&env, &tools_file, "", &server_env)).await;
    until_listed(&r, &env, &["echo", "keep"]).await;
    let count = || {
        std::fs::read_to_string(&lists)
            .unwrap_or_default()
            .lines()
            .count()
    };
    // The flood lasts a second or more (5 ms apart, and the server's own pace); the second
    // list answers the first notice at once.
    for _ in 0..100 {
        if count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(count() >= 2, "the first notice was not acted on");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Start, the first notice, then at most one a second over the flood and this wait.
    let n = count();
    assert!((3..=6).contains(&n), "{n} discoveries for 200 notices");
    r.shutdown().await;
}
