//! MCP requests as a 2026-07-28 client sends them (`_meta` in the body, mirrored headers), and
//! carapace in front of an MCP server (the Python SDK test servers in `tests/interop`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use carapace::client::{Client, Reply};
use carapace::server::Running;
use serde_json::{json, Value};

use super::Env;

pub const MODERN: &str = "2026-07-28";

/// A 2026-07-28 request body with its `_meta`.
pub fn modern_body(id: i64, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// `POST /mcp` with the headers mirrored from `body`: `Mcp-Method`, and `Mcp-Name` from
/// `params.name` (`tools/call`, `prompts/get`) or `params.uri` (`resources/read`).
pub async fn modern(client: &Client, body: &Value) -> Reply {
    let method = body["method"].as_str().unwrap();
    let mut h = vec![("mcp-protocol-version", MODERN), ("mcp-method", method)];
    let name = match method {
        "resources/read" => body["params"]["uri"].as_str(),
        _ => body["params"]["name"].as_str(),
    };
    if let Some(name) = name {
        h.push(("mcp-name", name));
    }
    client.post_json("/mcp", &h, body).await.unwrap()
}

/// A file under `tests/interop`.
pub fn interop(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(rel)
}
/// carapace with `front` over the MCP app `app` (the inside of `app: { ... }`).
pub fn yaml(env: &Env, front: &str, app: &str) -> String {
    env.tools_yaml("")
        .replace(
            "front: { protocol: tools-v1 }",
            &format!("front: {{ protocol: {front} }}"),
        )
        .replace(
            &format!(
                "app: {{ protocol: tools-v1, address: \"http://{}\" }}",
                env.app_addr
            ),
            &format!("app: {{ protocol: mcp, {app} }}"),
        )
}
/// Start carapace and wait (a child takes a moment to start) until the tools are discovered.
pub async fn start(env: &Env, yaml: &str) -> Running {
    let r = env.start_with(yaml, false).await;
    for _ in 0..400 {
        if r.shared.ready() {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the MCP server's tools were not discovered within 20 s");
}
/// The revision carapace agreed with the MCP server.
pub fn negotiated(r: &Running) -> String {
    match &**r.shared.app.load() {
        carapace::app::AppConn::Mcp(u) => u.negotiated().expect("negotiated").version.clone(),
        other => panic!("not an MCP app: {other:?}"),
    }
}
pub fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap()
}
/// The Python SDK's test server over Streamable HTTP on a Unix socket in `env`'s directory
/// (stopped when the child is dropped).
pub fn python_http_server(env: &Env) -> (tokio::process::Child, PathBuf) {
    let sock = env.path().join("py.sock");
    let child = tokio::process::Command::new("python3")
        .arg(interop("mcp_python_server.py"))
        .arg("--uds")
        .arg(&sock)
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    (child, sock)
}

/// carapace with `front` over the Python SDK's test server on Streamable HTTP, both running
/// (the server stops when its child is dropped).
pub async fn over_python_http(env: &Env, front: &str) -> (tokio::process::Child, Running) {
    let (server, sock) = python_http_server(env);
    let app = format!("address: \"unix:{}\"", sock.display());
    let r = start(env, &yaml(env, front, &app)).await;
    (server, r)
}

/// The `app` settings of the Python SDK's test server as a stdio command.
pub fn python_stdio_app() -> String {
    let python = [
        "python3".to_string(),
        interop("mcp_python_server.py").display().to_string(),
        "--stdio".into(),
    ];
    let path = std::env::var("PATH").unwrap_or_default();
    format!(
        "command: {}, env: {{ PATH: \"{path}\" }}",
        json_list(&python)
    )
}

/// Run the Python script `script` of `tests/interop` against `r`'s Unix socket (`--uds`) with
/// `args`; the one JSON object it prints.
pub async fn run_python(script: &str, r: &Running, args: &[&str]) -> Value {
    let sock = r.unix_path.clone().unwrap();
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["60", "python3", "-W", "ignore"])
        .arg(interop(script))
        .arg("--uds")
        .arg(&sock)
        .args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("python3 runs"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} {args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// carapace's MCP front (`front: { protocol: mcp<extra_front> }`) over the memory app's
/// tools-v1 back; `extra` as for [`Env::tools_yaml`].
pub fn front_yaml(env: &Env, extra_front: &str, extra: &str) -> String {
    env.tools_yaml(extra).replace(
        "front: { protocol: tools-v1 }",
        &format!("front: {{ protocol: mcp{extra_front} }}"),
    )
}

/// carapace's MCP front over the memory app, started.
pub async fn start_front(env: &Env, extra_front: &str) -> Running {
    env.start(&front_yaml(env, extra_front, "")).await
}

/// A JSON-RPC message `POST`ed to `/mcp` with `headers`.
pub async fn post(client: &Client, body: &Value, headers: &[(&str, String)]) -> Reply {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    client.post_json("/mcp", &h, body).await.unwrap()
}

/// The JSON-RPC error code of an answer (which must be an error).
pub fn error_code(r: &Reply) -> i64 {
    r.json()["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("{:?}", r.json()))
}
