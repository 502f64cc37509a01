//! `carapace demo`: a sample memory tool host behind carapace on loopback, and a walk through
//! what carapace does for it. Nothing to configure; everything lives in a temporary directory
//! that is removed afterwards.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::client::{tls_config, Client, Reply, Transport};
use crate::memory_app::MemoryApp;
use crate::pki::{Authority, Issued};
use crate::server::{self, Running};

mod basics;
mod eat;
mod mcp;
mod pinning;
mod provable;
mod relay;
mod shell_auth;

const DEMO_KEY: &str = "demo-hmac-key-do-not-use-in-production";

/// Run the demonstration; exit 0 when every step behaved as shown.
pub async fn run() -> ExitCode {
    let dir = std::env::temp_dir().join(format!(
        "carapace-demo-{}-{}",
        std::process::id(),
        hex::encode(rand::random::<[u8; 4]>())
    ));
    let result = run_in(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(codes) => {
            println!();
            println!("demo complete; error codes met: {}", codes.join(", "));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write(path: &Path, content: &str) -> Result<(), String> {
    std::fs::write(path, content).map_err(|e| format!("{}: {e}", path.display()))
}

async fn start(dir: &Path, yaml: &str) -> Result<Running, String> {
    start_or_address_taken(dir, yaml)
        .await
        .map_err(|e| match e {
            NotStarted::AddressTaken(e) | NotStarted::Other(e) => e,
        })
}

/// Why a demo process did not start.
enum NotStarted {
    /// An address it was to bind was taken.
    AddressTaken(String),
    Other(String),
}

/// [`start`], telling a taken address from any other failure.
async fn start_or_address_taken(dir: &Path, yaml: &str) -> Result<Running, NotStarted> {
    let loaded = crate::config::parse(yaml, dir).map_err(|e| {
        NotStarted::Other(
            e.0.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    let running = server::start(loaded).await.map_err(|e| match &e {
        server::StartError::Bind { source, .. }
            if source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            NotStarted::AddressTaken(e.to_string())
        }
        _ => NotStarted::Other(e.to_string()),
    })?;
    for _ in 0..100 {
        if running.shared.ready() {
            return Ok(running);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(NotStarted::Other("carapace did not become ready".into()))
}

/// Pair the tool host `host` as `memory-east` with `gateway`, through the gateway's admin
/// socket.
async fn pair_memory_east(gateway: &Running, host: &Running) -> Result<(), String> {
    let endpoint = format!(
        "ws://{}/v1/pair",
        host.pairing_address.ok_or("no pairing address")?
    );
    let (status, paired) = crate::admin::request(
        &gateway.admin_socket,
        http::Method::POST,
        "/v1/pairings",
        Some(
            json!({"component_type": "tool", "component_id": "memory-east", "endpoint": endpoint}),
        ),
    )
    .await?;
    if !status.is_success() {
        return Err(format!("pairing failed: {paired}"));
    }
    Ok(())
}

fn code(reply: &Reply) -> String {
    let v = reply.json();
    v["error"]["code"]
        .as_str()
        .or(v["error_code"].as_str())
        .unwrap_or("")
        .to_string()
}

fn expect(step: &str, reply: &Reply, want: &str) -> Result<String, String> {
    let got = code(reply);
    if got != want {
        return Err(format!(
            "{step}: expected {want}, got HTTP {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    Ok(got)
}

fn call(tool: &str, args: Value, timeout_ms: Option<u64>) -> Value {
    let mut c = json!({
        "version": "v1",
        "call_id": format!("demo-{}", hex::encode(rand::random::<[u8; 6]>())),
        "tool_name": tool,
        "tenant_id": "home",
        "args": args,
        "context": {"agent_id": "assistant", "session_id": "ses_demo", "request_origin": "agent_turn"},
    });
    if let Some(t) = timeout_ms {
        c["timeout_ms"] = json!(t);
    }
    c
}

/// The certificates of the first steps: the gateway's CA, the paired gateway's client
/// certificate and a stranger's from the same CA that was never paired. Written to `dir` with
/// carapace's server certificate, the HMAC key and the peer store.
struct Pki {
    ca: Authority,
    gateway: Issued,
    stranger: Issued,
}

impl Pki {
    fn write(dir: &Path) -> Result<Pki, String> {
        let ca = Authority::new("carapace demo gateway CA");
        let server_cert = ca.server(&["127.0.0.1", "localhost"]);
        let gateway = ca.client("gw_demo");
        let stranger = ca.client("stranger");
        write(&dir.join("ca.pem"), &ca.cert_pem())?;
        write(&dir.join("server.crt"), &server_cert.cert_pem)?;
        write(&dir.join("server.key"), &server_cert.key_pem)?;
        write(&dir.join("hmac.key"), DEMO_KEY)?;
        let peers = json!({"version": 1, "peers": [{
            "component_type": "gateway", "component_id": "gw_demo", "role": "gateway",
            "mtls_cert_fingerprint": gateway.fingerprint, "status": "active",
            "paired_at": "2026-11-21T00:00:00Z"
        }]});
        write(&dir.join("peers.json"), &peers.to_string())?;
        Ok(Pki {
            ca,
            gateway,
            stranger,
        })
    }
}

/// The tools-v1 front (mTLS, the paired gateway of `peers.json`) and the skill-v1 front
/// (HMAC with the demo key) before the app at `app_addr`.
async fn start_fronts(dir: &Path, app_addr: SocketAddr) -> Result<(Running, Running), String> {
    let tools = start(
        &dir.join("tools"),
        &format!(
            r#"
state_dir: {dir}/tools
front: {{ protocol: tools-v1 }}
listeners:
  unix: {{ path: {dir}/tools/tools.sock }}
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {dir}/server.crt, key_file: {dir}/server.key, client_ca_file: {dir}/ca.pem }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
peers: {{ file: {dir}/peers.json }}
ops: {{ address: "127.0.0.1:0" }}
"#,
            dir = dir.display()
        ),
    )
    .await?;
    let skill = start(
        &dir.join("skill"),
        &format!(
            r#"
state_dir: {dir}/skill
front:
  protocol: skill-v1
  skill_id: memory
  auth: {{ mode: hmac, keys: [ {{ id: demo, secret: {{ file: {dir}/hmac.key }} }} ] }}
listeners:
  tcp: {{ address: "127.0.0.1:0" }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
ops: {{ address: "" }}
"#,
            dir = dir.display()
        ),
    )
    .await?;
    Ok((tools, skill))
}

async fn run_in(dir: &Path) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let pki = Pki::write(dir)?;
    let app = Arc::new(MemoryApp::default());
    let app_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let app_addr = app_listener.local_addr().map_err(|e| e.to_string())?;
    let _app_task = app.serve(app_listener);
    let (tools, skill) = start_fronts(dir, app_addr).await?;
    let tools_addr = tools.tcp_address.ok_or("no tcp address")?;
    let skill_addr = skill.tcp_address.ok_or("no tcp address")?;

    println!("carapace demo");
    println!("  app:      sample memory tool host on http://{app_addr} (memory.append, memory.query, memory.delete)");
    println!("  carapace: tools-v1 front on https://{tools_addr} (mTLS, paired gateway gw_demo)");
    println!("  carapace: skill-v1 front on http://{skill_addr} (HMAC-SHA256, nonce store)");
    println!();

    let gw = Client::new(Transport::Tls {
        address: tools_addr,
        config: tls_config(&pki.ca.cert_pem(), Some(&pki.gateway), false),
    });
    let fronts = basics::Fronts {
        app: &app,
        tools: &tools,
        tools_addr,
        skill_addr,
        gw: &gw,
    };
    let mut codes = basics::basic_steps(&fronts, &pki.ca, &pki.stranger).await?;
    let (ca, gateway) = (&pki.ca, &pki.gateway);
    let app_addr = app_addr.to_string();
    codes.extend(mcp::mcp_steps(dir, &app_addr, ca, gateway, &app).await?);
    mcp::outbound_step(dir, &app_addr, &app).await?;
    pinning::pinning_step(dir, &app_addr).await?;
    shell_auth::oauth_step(dir, &app_addr, ca).await?;
    shell_auth::signature_step(dir, &app_addr, ca).await?;
    eat::eat_step(dir, &app_addr, ca, gateway).await?;
    relay::relay_step(dir, &app_addr).await?;
    provable::provable_steps(dir, &app_addr, &app).await?;
    tools.shutdown().await;
    skill.shutdown().await;
    Ok(codes)
}
