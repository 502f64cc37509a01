//! 14: the signed EAT catalog, served by one carapace and verified by another.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde_json::json;

use super::{call, start};
use crate::client::{tls_config, Client, Transport};
use crate::eat::discover::{self, DiscoveryError, Fetch, Fetched, Outcome};
use crate::pki::{Authority, Issued};
use crate::server::Running;

/// The documents of the demo host as the gateway gets them, with one catalog byte (the
/// first `m`, inside a name or a string) changed when `tamper` is set.
struct DemoFetch {
    client: Client,
    tamper: bool,
}

impl Fetch for DemoFetch {
    async fn get(&self, path: &str, _: Option<&str>) -> Result<Fetched, DiscoveryError> {
        let r = self
            .client
            .send(Method::GET, path, &[], "")
            .await
            .map_err(DiscoveryError::Unreachable)?;
        let mut body = r.body.to_vec();
        if self.tamper && path == crate::eat::documents::CATALOG_PATH {
            if let Some(at) = body.iter().position(|b| *b == b'm') {
                body[at] = b'M';
            }
        }
        Ok(Fetched {
            status: r.status.as_u16(),
            headers: r.headers,
            body: Bytes::from(body),
        })
    }
}

/// 14: carapace A publishes its MCP front's tools as a signed EAT catalog; carapace B
/// verifies it, takes the tool tagged `memory`, and calls it through A.
pub(super) async fn eat_step(
    dir: &Path,
    app_addr: &str,
    ca: &Authority,
    gateway: &Issued,
) -> Result<(), String> {
    let (host, port) = start_host(dir, app_addr).await?;
    let client = Client::new(Transport::Tls {
        address: host.tcp_address.ok_or("no tcp address")?,
        config: tls_config(&ca.cert_pem(), Some(gateway), false),
    });
    let catalog = client
        .send(Method::GET, "/.well-known/api-catalog", &[], "")
        .await?;
    let tools = catalog.json()["tools"].as_array().map_or(0, Vec::len);
    let jws = catalog
        .headers
        .get("x-jws-signature")
        .and_then(|v| v.to_str().ok())
        .ok_or("the catalog is not signed")?
        .to_owned();
    let kid = crate::eat::jws::parse(&jws).map_err(|e| e.to_string())?.kid;

    let gw_dir = dir.join("eat-gateway");
    let gw = start_gateway(dir, &gw_dir, app_addr, gateway, port).await?;
    let agent = Client::new(Transport::Unix(gw_dir.join("outbound.sock")));
    let listed = listed_tools(&agent).await?;
    let answer = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "cat"}), None),
        )
        .await?;
    if listed != ["memory.query"] || answer.json()["status"] != "ok" {
        return Err(format!(
            "EAT: the gateway listed {listed:?} and answered {}",
            String::from_utf8_lossy(&answer.body)
        ));
    }
    let refused = tampered_is_refused(&client, port).await?;
    println!(
        "14. EAT catalog   GET /.well-known/api-catalog -> {tools} tools, X-JWS-Signature RS256 kid={}...; the gateway verified it (did:web:localhost%3A{port}) and took memory.query (tag memory) -> call {}; one catalog byte changed -> refused {refused}",
        &kid[..8.min(kid.len())],
        answer.json()["status"]
    );
    gw.shutdown().await;
    host.shutdown().await;
    Ok(())
}

/// Carapace A: an MCP front publishing `memory.query` in its EAT catalog; with its port.
async fn start_host(dir: &Path, app_addr: &str) -> Result<(Running, u16), String> {
    // The host names its own address in its configuration (`base_url`), so its port is
    // chosen before it binds, and another process may take it in between: then another port.
    let mut attempts = 0;
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let yaml = format!(
            r#"
state_dir: {dir}/eat-host
front:
  protocol: mcp
  eat:
    base_url: "https://localhost:{port}"
    title: Demo memory
    tools:
      memory.query: {{ capabilities: [memory, read-only] }}
listeners:
  tcp:
    address: "127.0.0.1:{port}"
    tls: {{ cert_file: {dir}/server.crt, key_file: {dir}/server.key, client_ca_file: {dir}/ca.pem }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
peers: {{ file: {dir}/peers.json }}
ops: {{ address: "" }}
"#,
            dir = dir.display()
        );
        attempts += 1;
        match super::start_or_address_taken(&dir.join("eat-host"), &yaml).await {
            Ok(host) => return Ok((host, port)),
            Err(super::NotStarted::AddressTaken(_)) if attempts < 5 => continue,
            Err(super::NotStarted::AddressTaken(e) | super::NotStarted::Other(e)) => return Err(e),
        }
    }
}

/// Carapace B: a gateway whose outbound role discovers A's catalog (the tools tagged
/// `memory`), with the paired gateway's client certificate.
async fn start_gateway(
    dir: &Path,
    gw_dir: &Path,
    app_addr: &str,
    gateway: &Issued,
    port: u16,
) -> Result<Running, String> {
    std::fs::write(dir.join("gw_demo.crt"), &gateway.cert_pem).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("gw_demo.key"), &gateway.key_pem).map_err(|e| e.to_string())?;
    start(
        gw_dir,
        &format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
ops: {{ address: "" }}
gateway: {{ id: gw_eat }}
outbound:
  socket: {d}/outbound.sock
  peers: {{}}
  eat:
    demo-memory:
      url: "https://localhost:{port}/.well-known/api-catalog"
      capabilities: [memory]
      ca_file: {dir}/ca.pem
      cert_file: {dir}/gw_demo.crt
      key_file: {dir}/gw_demo.key
"#,
            d = gw_dir.display(),
            dir = dir.display()
        ),
    )
    .await
}

/// The tools the gateway's outbound socket lists, once its discovery found some (up to 5 s).
async fn listed_tools(agent: &Client) -> Result<Vec<String>, String> {
    let mut listed = Vec::new();
    for _ in 0..100 {
        let list = agent.send(Method::GET, "/v1/tools", &[], "").await?;
        listed = list.json()["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect::<Vec<_>>();
        if !listed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(listed)
}

/// Discovery of the host's documents with one catalog byte changed: the reason it refused.
async fn tampered_is_refused(client: &Client, port: u16) -> Result<&'static str, String> {
    let request = discover::Request {
        origin: format!("https://localhost:{port}"),
        path: "/.well-known/api-catalog".into(),
        allow_unsigned: false,
        capabilities: vec!["memory".into()],
        same_origin: true,
        skew_s: 60,
    };
    let now = carapace_filters::unix_now_ms() / 1000;
    let tampered = DemoFetch {
        client: client.clone(),
        tamper: true,
    };
    match discover::discover(&tampered, &request, None, now).await {
        Err(e) => Ok(e.reason()),
        Ok(Outcome::New(_) | Outcome::Unchanged { .. }) => {
            Err("EAT: a changed catalog was taken".into())
        }
    }
}
