//! Demo steps 7 to 10: MCP in front of the app in both eras, an MCP server behind carapace,
//! and a gateway's outbound socket as one MCP server.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::start;
use crate::client::{tls_config, Client, Reply, Transport};
use crate::memory_app::MemoryApp;
use crate::pki::Authority;
use crate::server::Running;

/// A JSON-RPC request as a 2026-07-28 MCP client sends it, with its mirrored headers.
async fn mcp_modern(
    gw: &Client,
    id: u64,
    method: &str,
    mut params: Value,
) -> Result<Reply, String> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": crate::mcp::MODERN_VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "carapace-demo", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let name = params["name"].as_str().unwrap_or("").to_string();
    let mut headers = vec![
        ("mcp-protocol-version", crate::mcp::MODERN_VERSION),
        ("mcp-method", method),
    ];
    if !name.is_empty() {
        headers.push(("mcp-name", name.as_str()));
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    gw.post_json("/mcp", &headers, &body).await
}

/// 7 and 8: the same app behind an MCP front, called as a 2026-07-28 client and as an older
/// client with a session.
pub(super) async fn mcp_steps(
    dir: &Path,
    app_addr: &str,
    ca: &Authority,
    gateway: &crate::pki::Issued,
    app: &MemoryApp,
) -> Result<Vec<String>, String> {
    let mcp = start(
        &dir.join("mcp"),
        &format!(
            r#"
state_dir: {dir}/mcp
front: {{ protocol: mcp }}
listeners:
  unix: {{ path: {dir}/mcp.sock }}
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {dir}/server.crt, key_file: {dir}/server.key, client_ca_file: {dir}/ca.pem }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
peers: {{ file: {dir}/peers.json }}
ops: {{ address: "" }}
"#,
            dir = dir.display()
        ),
    )
    .await?;
    let addr = mcp.tcp_address.ok_or("no tcp address")?;
    let gw = Client::new(Transport::Tls {
        address: addr,
        config: tls_config(&ca.cert_pem(), Some(gateway), false),
    });
    let bad_code = modern_step(&gw, addr, app).await?;
    session_step(&gw).await?;
    mcp_back_step(dir).await?;
    mcp.shutdown().await;
    Ok(vec![bad_code])
}

/// 7: a 2026-07-28 client lists the tools, calls one, and sends bad arguments (not forwarded);
/// the error code met.
async fn modern_step(
    gw: &Client,
    addr: std::net::SocketAddr,
    app: &MemoryApp,
) -> Result<String, String> {
    let list = mcp_modern(gw, 1, "tools/list", json!({})).await?;
    let tools = list.json()["result"]["tools"]
        .as_array()
        .map_or(0, Vec::len);
    let good = mcp_modern(
        gw,
        2,
        "tools/call",
        json!({"name": "memory.query", "arguments": {"query": "cat"}}),
    )
    .await?;
    if good.json()["result"]["isError"] != false {
        return Err(format!(
            "MCP call failed: {}",
            String::from_utf8_lossy(&good.body)
        ));
    }
    let before = app.received().len();
    let bad = mcp_modern(
        gw,
        3,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": 42}}),
    )
    .await?;
    let bad_code = bad.json()["result"]["_meta"]["dev.carapace/error"]["code"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if bad.json()["result"]["isError"] != true
        || bad_code != "INVALID_ARGS"
        || app.received().len() != before
    {
        return Err(format!(
            "MCP bad arguments: {}",
            String::from_utf8_lossy(&bad.body)
        ));
    }
    println!(
        "7. MCP 2026-07-28  https://{addr}/mcp tools/list -> {tools} tools; tools/call memory.query -> structuredContent={}; bad arguments -> isError {bad_code}, not forwarded",
        good.json()["result"]["structuredContent"]
    );
    Ok(bad_code)
}

/// 8: an older (2025-06-18) client: `initialize` gives a session, a call in it is answered,
/// one without it refused.
async fn session_step(gw: &Client) -> Result<(), String> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}}});
    let i = gw.post_json("/mcp", &[], &init).await?;
    let session = i
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .ok_or("initialize gave no session")?
        .to_string();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "memory.query", "arguments": {"query": "mat"}}});
    let in_session = gw
        .post_json("/mcp", &[("mcp-session-id", session.as_str())], &call)
        .await?;
    let without = gw.post_json("/mcp", &[], &call).await?;
    println!(
        "8. MCP 2025-06-18  initialize -> session {}...; tools/call in it -> isError={}; without the session -> HTTP {}",
        &session[..12.min(session.len())],
        in_session.json()["result"]["isError"],
        without.status.as_u16()
    );
    Ok(())
}

/// 9: carapace in front of a stdio MCP server. The server is `carapace mcp-stdio` bridging to
/// step 7's MCP endpoint, so the demo needs nothing else installed; any stdio MCP server is
/// configured the same way.
async fn mcp_back_step(dir: &Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let behind = start(
        &dir.join("behind"),
        &format!(
            r#"
state_dir: {dir}/behind
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {dir}/behind.sock }} }}
app:
  protocol: mcp
  command: ["{exe}", mcp-stdio, --socket, "{dir}/mcp.sock"]
peers: {{ file: {dir}/peers.json }}
ops: {{ address: "" }}
"#,
            dir = dir.display(),
            exe = exe.display(),
        ),
    )
    .await?;
    let local = Client::new(Transport::Unix(dir.join("behind.sock")));
    let call = json!({"version": "v1", "call_id": "c-9", "tool_name": "memory.query",
        "tenant_id": "home", "args": {"query": "cat"},
        "context": {"agent_id": "demo", "session_id": "s-9"}});
    let reply = local.post_json("/v1/tools/call", &[], &call).await?;
    if reply.json()["status"] != "ok" {
        return Err(format!(
            "call to the MCP server failed: {}",
            String::from_utf8_lossy(&reply.body)
        ));
    }
    println!(
        "9. MCP back       tools-v1 front over a stdio MCP server (`carapace mcp-stdio` to step 7) -> memory.query \"ok\" result={}",
        reply.json()["result"]
    );
    behind.shutdown().await;
    Ok(())
}

/// 10: a gateway pairs a tool host (the pairing handshake, through its admin socket), and its
/// local agent lists and calls the tool host's tools over MCP on the outbound socket.
pub(super) async fn outbound_step(
    dir: &Path,
    app_addr: &str,
    app: &MemoryApp,
) -> Result<(), String> {
    let (host, gateway) = start_paired(dir, app_addr).await?;
    let agent = Client::new(Transport::Unix(dir.join("gateway/outbound.sock")));
    let mut tools = 0;
    for _ in 0..100 {
        let list = mcp_modern(&agent, 1, "tools/list", json!({})).await?;
        tools = list.json()["result"]["tools"]
            .as_array()
            .map_or(0, Vec::len);
        if tools > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = app.received().len();
    let call = mcp_modern(
        &agent,
        2,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": "from the gateway's agent"}}),
    )
    .await?;
    let reached = app
        .received()
        .get(before)
        .map(|r| r.headers["x-carapace-peer-id"].clone());
    if call.json()["result"]["isError"] != false || reached.is_none() {
        return Err(format!(
            "outbound MCP call failed: {}",
            String::from_utf8_lossy(&call.body)
        ));
    }
    println!(
        "10. outbound MCP  gateway paired memory-east; its agent on the outbound socket's /mcp: tools/list -> {tools} tools; tools/call memory.append -> isError=false, the app saw caller {:?} (`carapace mcp-stdio` serves the same to a stdio agent)",
        reached.expect("checked")
    );
    gateway.shutdown().await;
    host.shutdown().await;
    Ok(())
}

/// A tool host (`memory-east`, with a pairing listener) and a gateway paired with it through
/// the gateway's admin socket; the gateway's outbound socket is `gateway/outbound.sock`.
async fn start_paired(dir: &Path, app_addr: &str) -> Result<(Running, Running), String> {
    let gw_dir = dir.join("gateway");
    std::fs::create_dir_all(gw_dir.join("state")).map_err(|e| e.to_string())?;
    let gateway_key =
        crate::pairing::identity::GatewayIdentity::load_or_create(&gw_dir.join("state"), "gw_home")
            .map_err(|e| e.to_string())?
            .public_key_ed25519();
    std::fs::write(
        dir.join("host-peers.json"),
        r#"{"version": 1, "peers": []}"#,
    )
    .map_err(|e| e.to_string())?;
    let host = start(
        &dir.join("host"),
        &format!(
            r#"
state_dir: {dir}/host
front: {{ protocol: tools-v1 }}
listeners:
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {dir}/server.crt, key_file: {dir}/server.key, client_ca_file: {dir}/ca.pem }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
peers: {{ file: {dir}/host-peers.json }}
ops: {{ address: "" }}
pairing: {{ listen: "127.0.0.1:0", component_id: memory-east, gateway_public_key_ed25519: "{gateway_key}" }}
"#,
            dir = dir.display()
        ),
    )
    .await?;
    let gateway = start(
        &gw_dir,
        &format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{ memory-east: {{ url: "https://{tools}" }} }}
"#,
            d = gw_dir.display(),
            tools = host.tcp_address.ok_or("no tcp address")?,
        ),
    )
    .await?;
    super::pair_memory_east(&gateway, &host).await?;
    Ok((host, gateway))
}
