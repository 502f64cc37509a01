//! `carapace demo`: a sample memory tool host behind carapace on loopback, and a walk through
//! what carapace does for it. Nothing to configure; everything lives in a temporary directory
//! that is removed afterwards.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};

use crate::client::{signed_run, tls_config, Client, Reply, Transport};
use crate::memory_app::MemoryApp;
use crate::pki::Authority;
use crate::server::{self, Running};

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

async fn run_in(dir: &Path) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut codes = Vec::new();

    // A gateway CA, a server certificate for carapace, the paired gateway's client
    // certificate, and a stranger's certificate from the same CA that was never paired.
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

    let app = Arc::new(MemoryApp::default());
    let app_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let app_addr = app_listener.local_addr().map_err(|e| e.to_string())?;
    let _app_task = app.serve(app_listener);

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
    let tools_addr = tools.tcp_address.ok_or("no tcp address")?;
    let skill_addr = skill.tcp_address.ok_or("no tcp address")?;

    println!("carapace demo");
    println!("  app:      sample memory tool host on http://{app_addr} (memory.append, memory.query, memory.delete)");
    println!("  carapace: tools-v1 front on https://{tools_addr} (mTLS, paired gateway gw_demo)");
    println!("  carapace: skill-v1 front on http://{skill_addr} (HMAC-SHA256, nonce store)");
    println!();

    let gw = Client::new(Transport::Tls {
        address: tools_addr,
        config: tls_config(&ca.cert_pem(), Some(&gateway), false),
    });

    // 1. A good call.
    let r = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call(
                "memory.append",
                json!({"text": "the cat sat on the mat"}),
                None,
            ),
        )
        .await?;
    if r.json()["status"] != "ok" {
        return Err(format!(
            "good call failed: {}",
            String::from_utf8_lossy(&r.body)
        ));
    }
    let seen = app.received();
    println!(
        "1. good call       memory.append over mTLS -> {} result={}; the app saw caller {:?}",
        r.json()["status"],
        r.json()["result"],
        seen.last()
            .and_then(|c| c.headers.get("x-carapace-peer-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
    );

    // 2. Bad arguments never reach the app.
    let before = app.received().len();
    let r = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call(
                "memory.append",
                json!({"text": 42, "drop_table": true}),
                None,
            ),
        )
        .await?;
    codes.push(expect("bad arguments", &r, "INVALID_ARGS")?);
    let reached = app.received().len() - before;
    if reached != 0 {
        return Err("bad arguments reached the app".into());
    }
    println!(
        "2. bad arguments   memory.append {{text: 42, drop_table: true}} -> HTTP {} {}; calls that reached the app: {reached}",
        r.status.as_u16(),
        code(&r)
    );

    // 3. A certificate from the right CA that was never paired.
    let outsider = Client::new(Transport::Tls {
        address: tools_addr,
        config: tls_config(&ca.cert_pem(), Some(&stranger), false),
    });
    let r = outsider
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "cat"}), None),
        )
        .await?;
    codes.push(expect("unpaired peer", &r, "PAIRING_REQUIRED")?);
    println!(
        "3. unpaired peer   valid certificate, not in the peer store -> HTTP {} {}",
        r.status.as_u16(),
        code(&r)
    );

    // 4. A signed Skill Gateway v1 call, then the same bytes again.
    let signer = Client::new(Transport::Tcp(skill_addr));
    let body = signed_run(
        DEMO_KEY.as_bytes(),
        "memory",
        "memory.query",
        json!({"query": "cat"}),
        carapace_filters::unix_now_ms(),
        &hex::encode(rand::random::<[u8; 16]>()),
    );
    let first = signer.post_json("/run", &[], &body).await?;
    if first.json()["ok"] != true {
        return Err(format!(
            "signed call failed: {}",
            String::from_utf8_lossy(&first.body)
        ));
    }
    let replay = signer.post_json("/run", &[], &body).await?;
    codes.push(expect("replay", &replay, "NONCE_REPLAY")?);
    println!(
        "4. replay          signed /run memory.query -> ok={} output={}; same request again -> HTTP {} {}",
        first.json()["ok"],
        first.json()["output"],
        replay.status.as_u16(),
        code(&replay)
    );

    // 5. The kill-switch, through the admin socket.
    let (status, _) = crate::ops::admin::request(
        &tools.admin_socket,
        Method::PUT,
        "/v1/kill-switch",
        Some(json!({"engaged": true, "tool": "memory.delete"})),
    )
    .await?;
    if !status.is_success() {
        return Err(format!("kill-switch engage: HTTP {status}"));
    }
    let killed = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "m1"}), None),
        )
        .await?;
    codes.push(expect("kill-switch", &killed, "DEPENDENCY_UNAVAILABLE")?);
    crate::ops::admin::request(
        &tools.admin_socket,
        Method::PUT,
        "/v1/kill-switch",
        Some(json!({"engaged": false, "tool": "memory.delete"})),
    )
    .await?;
    let released = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.delete", json!({"id": "m1"}), None),
        )
        .await?;
    println!(
        "5. kill-switch     engaged for memory.delete -> HTTP {} {}; released -> {}",
        killed.status.as_u16(),
        code(&killed),
        released.json()["status"]
    );

    // 6. A call that runs past its timeout is cut off.
    let r = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call(
                "memory.query",
                json!({"query": "cat", "delay_ms": 5000}),
                Some(300),
            ),
        )
        .await?;
    codes.push(expect("timeout", &r, "TIMEOUT")?);
    let mut abandoned = 0;
    for _ in 0..40 {
        abandoned = app.abandoned();
        if abandoned > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    println!(
        "6. timeout         memory.query taking 5 s with timeout_ms=300 -> HTTP {} {} (status {}); upstream request dropped: {}",
        r.status.as_u16(),
        code(&r),
        r.json()["status"],
        abandoned > 0
    );

    codes.extend(mcp::mcp_steps(dir, &app_addr.to_string(), &ca, &gateway, &app).await?);
    mcp::outbound_step(dir, &app_addr.to_string(), &app).await?;
    pinning::pinning_step(dir, &app_addr.to_string()).await?;
    shell_auth::oauth_step(dir, &app_addr.to_string(), &ca).await?;
    shell_auth::signature_step(dir, &app_addr.to_string(), &ca).await?;
    eat::eat_step(dir, &app_addr.to_string(), &ca, &gateway).await?;
    relay::relay_step(dir, &app_addr.to_string()).await?;
    provable::provable_steps(dir, &app_addr.to_string(), &app).await?;
    tools.shutdown().await;
    skill.shutdown().await;
    Ok(codes)
}
