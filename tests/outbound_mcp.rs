//! The outbound role as one MCP server: every paired tool host's and configured skill's tools
//! on the outbound socket's `/mcp`, and through `carapace mcp-stdio` for an agent that only
//! starts commands.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use carapace::client::{Client, Transport};
use carapace::server::Running;
use common::mcp::{modern, modern_body};
use common::{pair_through_admin, write_peers, Env};
use http::{Method, StatusCode};
use serde_json::{json, Value};

/// A gateway with a paired tool host (the memory app behind carapace) and a skill.
struct Setup {
    env: Env,
    _host: Running,
    gw: Running,
    _skill: std::sync::Arc<common::SkillApp>,
    socket: PathBuf,
}

async fn setup() -> Setup {
    setup_with(None, "memory.append", "").await
}

/// The same, with the tool host's app `host_app` (the inside of `app: { ... }`; the memory
/// app when `None`) and `outbound_extra` in the gateway's `outbound` section (YAML lines,
/// indented two spaces), ready once the gateway lists `tool`.
async fn setup_with(host_app: Option<String>, tool: &str, outbound_extra: &str) -> Setup {
    setup_full(host_app, tool, outbound_extra, false).await
}

/// `signed`: the tool host's front asks for RFC 9421 signatures, and the gateway signs its
/// requests to it with its identity key.
async fn setup_full(
    host_app: Option<String>,
    tool: &str,
    outbound_extra: &str,
    signed: bool,
) -> Setup {
    let env = Env::new().await;
    let outbound_extra = &outbound_extra.replace("{ENV}", &env.path().display().to_string());
    write_peers(&env.path().join("peers.json"), &[]);
    let secret = b"skill-secret-for-outbound";
    let (skill, skill_addr) =
        common::SkillApp::start(secret, common::SkillApp::vagus_manifest()).await;
    std::fs::write(env.path().join("skill.key"), secret).unwrap();
    let d = env.path().join("gw");
    std::fs::create_dir_all(d.join("state")).unwrap();
    let gw_key =
        carapace::pairing::identity::GatewayIdentity::load_or_create(&d.join("state"), "gw_home")
            .unwrap()
            .public_key_ed25519();
    let pairing = format!(
        "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{gw_key}\" }}"
    );
    let mut host_yaml = env.tools_yaml(&pairing);
    if signed {
        host_yaml = host_yaml.replace(
            "front: { protocol: tools-v1 }",
            "front: { protocol: tools-v1, auth: { mode: http_signature } }",
        );
    }
    let peer_signs = if signed { ", http_signature: true" } else { "" };
    if let Some(app) = host_app {
        host_yaml = host_yaml.replace(
            &format!(
                "app: {{ protocol: tools-v1, address: \"http://{}\" }}",
                env.app_addr
            ),
            &format!("app: {{ {app} }}"),
        );
    }
    let host = env.start_with(&host_yaml, false).await;
    for _ in 0..400 {
        if host.shared.ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        host.shared.ready(),
        "the tool host discovered its app's tools"
    );
    std::fs::write(
        d.join("carapace.yaml"),
        format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{ memory-east: {{ url: "https://{tools}"{peer_signs} }} }}
{outbound_extra}
  skills:
    demo.echo:
      url: "http://{skill_addr}"
      capabilities: [demo.echo]
      auth: {{ mode: hmac, header_name: X-Skill-Signature, secret: {{ file: {key} }} }}
"#,
            d = d.display(),
            app = env.app_addr,
            tools = host.tcp_address.unwrap(),
            key = env.path().join("skill.key").display(),
        ),
    )
    .unwrap();
    let gw = carapace::server::start(carapace::config::load(&d.join("carapace.yaml")).unwrap())
        .await
        .unwrap();
    pair_through_admin(&gw, &host, "memory-east").await;
    let socket = d.join("outbound.sock");
    let agent = Client::new(Transport::Unix(socket.clone()));
    for _ in 0..200 {
        let list = agent.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
        let names = list.json()["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if names.iter().any(|n| n == tool) && names.iter().any(|n| n == "demo.echo") {
            return Setup {
                env,
                _host: host,
                gw,
                _skill: skill,
                socket,
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let list = agent.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
    panic!(
        "the gateway did not discover the tool host's and the skill's tools: {}",
        list.json()
    );
}

#[tokio::test]
async fn the_outbound_socket_serves_every_paired_tool_and_skill_over_mcp() {
    let s = setup().await;
    let agent = Client::new(Transport::Unix(s.socket.clone()));
    let list = modern(&agent, &modern_body(1, "tools/list", json!({})))
        .await
        .json();
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"memory.append") && names.contains(&"demo.echo"),
        "{list}"
    );

    let call = modern_body(
        2,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": "over mcp"}}),
    );
    let answer = modern(&agent, &call).await.json();
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    let seen = s.env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-carapace-peer-id"], "gw_home");
    assert_eq!(seen[0].body["args"]["text"], "over mcp");

    let echo = modern_body(
        3,
        "tools/call",
        json!({"name": "demo.echo", "arguments": {"message": "hi"}}),
    );
    let answer = modern(&agent, &echo).await.json();
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["result"], "echo:hi",
        "{answer}"
    );
    s.gw.shutdown().await;
}

fn interop(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(rel)
}

/// The Python SDK's stdio client starts `carapace mcp-stdio` and, in each era, lists and
/// calls the paired tool host's tools through it.
#[tokio::test]
async fn the_python_sdk_reaches_paired_tool_hosts_through_carapace_mcp_stdio() {
    let s = setup().await;
    let command = json!([
        env!("CARGO_BIN_EXE_carapace"),
        "mcp-stdio",
        "--socket",
        s.socket
    ]);
    for mode in ["2026-07-28", "legacy"] {
        let command = command.to_string();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("timeout")
                .arg("60")
                .arg("python3")
                .arg(interop("mcp_python_client.py"))
                .args(["--stdio", &command, "--mode", mode])
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
        let tools = seen["tools"].as_array().unwrap();
        assert!(
            tools.contains(&json!("memory.append")) && tools.contains(&json!("demo.echo")),
            "{seen}"
        );
        assert_eq!(seen["good"]["is_error"], false, "{mode}: {seen}");
        assert!(
            seen["bad"]["text"][0]
                .as_str()
                .unwrap()
                .starts_with("INVALID_ARGS"),
            "{mode}: {seen}"
        );
    }
    // Only the good calls reached the tool host, each from the gateway.
    let seen = s.env.app.received();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen
        .iter()
        .all(|r| r.headers["x-carapace-peer-id"] == "gw_home"));
    s.gw.shutdown().await;
}

/// A paired tool host whose app is an MCP server (the Python SDK's, over stdio): the gateway's
/// agent calls its tools with tools-v1 and with MCP, through mTLS and both carapaces.
#[tokio::test]
async fn the_gateways_agent_calls_an_mcp_server_behind_a_paired_tool_host() {
    let argv = json!(["python3", interop("mcp_python_server.py"), "--stdio"]);
    let path = std::env::var("PATH").unwrap_or_default();
    let app = format!("protocol: mcp, command: {argv}, env: {{ PATH: \"{path}\" }}");
    let s = setup_with(Some(app), "echo", "").await;
    let agent = Client::new(Transport::Unix(s.socket.clone()));
    let reply = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("add", json!({"a": 20, "b": 22})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok", "{}", reply.json());
    assert_eq!(reply.json()["result"], json!({"sum": 42}));
    let bad = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("add", json!({"a": "x", "b": 1})),
        )
        .await
        .unwrap();
    assert_eq!(common::code(&bad), "INVALID_ARGS", "{}", bad.json());
    let echo = modern_body(
        1,
        "tools/call",
        json!({"name": "echo", "arguments": {"message": "far"}}),
    );
    let answer = modern(&agent, &echo).await.json();
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    s.gw.shutdown().await;
}

/// The gateway pins the tools its peers serve: a tool a paired tool host starts to describe
/// differently is withheld from the agent until approved (`outbound.pinning: enforce`).
#[tokio::test]
async fn a_peer_tool_that_changes_is_withheld_from_the_agent_until_approved() {
    let tools_file = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let write = |ty: &str| {
        let tools = json!([{"name": "echo", "description": "Echo.",
            "inputSchema": {"type": "object", "properties": {"text": {"type": ty}}}}]);
        let tmp = tools_file.with_extension("tmp");
        std::fs::write(&tmp, tools.to_string()).unwrap();
        std::fs::rename(&tmp, &tools_file).unwrap();
    };
    write("string");
    let argv = json!(["python3", interop("shifty_mcp_server.py")]);
    let path = std::env::var("PATH").unwrap_or_default();
    // The tool host serves the change (its own pinning off); the gateway is the one to pin.
    let app = format!(
        "protocol: mcp, command: {argv}, env: {{ PATH: \"{path}\", TOOLS_FILE: \"{}\" }}, \
         pinning: {{ mode: off }}",
        tools_file.display()
    );
    let extra = "  discovery_interval_s: 1\n  pinning: { mode: enforce }";
    let s = setup_with(Some(app), "echo", extra).await;
    let agent = Client::new(Transport::Unix(s.socket.clone()));
    let names = || async {
        let list = agent.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
        list.json()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    write("integer");
    let mut withheld = false;
    for _ in 0..100 {
        if !names().await.contains(&"echo".to_string()) {
            withheld = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        withheld,
        "the changed tool is still offered: {:?}",
        names().await
    );
    let refused = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("echo", json!({"text": 1})),
        )
        .await
        .unwrap();
    assert_eq!(common::code(&refused), "FORBIDDEN", "{}", refused.json());
    assert_eq!(
        refused.json()["error"]["details"]["reason"],
        "tool_not_approved"
    );

    let (status, approved) = carapace::admin::request(
        &s.gw.admin_socket,
        Method::POST,
        "/v1/tools/approve",
        Some(json!({"tool": "echo", "outbound": true})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{approved}");
    for _ in 0..100 {
        if names().await.contains(&"echo".to_string()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let called = agent
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("echo", json!({"text": 1})),
        )
        .await
        .unwrap();
    assert_eq!(called.json()["status"], "ok", "{}", called.json());
    s.gw.shutdown().await;
}

#[tokio::test]
async fn the_gateway_signs_its_requests_for_a_host_that_asks() {
    // The host refuses every unsigned request: discovery and the call pass only signed.
    let s = setup_full(None, "memory.append", "", true).await;
    let agent = Client::new(Transport::Unix(s.socket.clone()));
    let call = modern_body(
        1,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": "signed by the gateway"}}),
    );
    let answer = modern(&agent, &call).await.json();
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    let seen = s.env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-carapace-peer-id"], "gw_home");
    s.gw.shutdown().await;
}

#[tokio::test]
async fn remote_agents_reach_the_outbound_endpoint_with_oauth_tokens() {
    let issuer = common::oauth::Issuer::new("k1");
    let keys = tempfile::tempdir().unwrap();
    let jwks = keys.path().join("jwks.json");
    std::fs::write(&jwks, issuer.jwks.to_string()).unwrap();
    let listen = format!(
        r#"  listen:
    address: "127.0.0.1:0"
    cert_file: {{ENV}}/server.crt
    key_file: {{ENV}}/server.key
    oauth:
      resource: "https://gateway.test/mcp"
      issuer: "https://auth.test"
      jwks_file: {}
      scopes: {{ memory: ["tool.call:memory.*"], "memory:read": ["tool.call:memory.query"] }}"#,
        jwks.display()
    );
    let s = setup_with(None, "memory.append", &listen).await;
    let remote = Client::new(Transport::Tls {
        address: s.gw.outbound_address.expect("outbound listener"),
        config: carapace::client::tls_config(&s.env.pki.ca.cert_pem(), None, false),
    });
    let now = carapace_filters::unix_now_ms() / 1000;
    let token = |scope: &str| {
        issuer.token(
            &json!({"iss": "https://auth.test", "aud": "https://gateway.test/mcp",
            "sub": "remote-agent", "scope": scope, "iat": now, "exp": now + 300}),
        )
    };
    let call = |tool: &str| {
        modern_body(
            1,
            "tools/call",
            json!({"name": tool, "arguments": {"text": "from afar"}}),
        )
    };
    let send = |token: Option<String>, body: Value| {
        let remote = remote.clone();
        async move {
            let auth = token.map(|t| format!("Bearer {t}"));
            let name = body["params"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let mut h = vec![
                ("mcp-protocol-version", common::mcp::MODERN),
                ("mcp-method", body["method"].as_str().unwrap()),
            ];
            if !name.is_empty() {
                h.push(("mcp-name", name.as_str()));
            }
            if let Some(a) = &auth {
                h.push(("authorization", a.as_str()));
            }
            remote.post_json("/mcp", &h, &body).await.unwrap()
        }
    };
    // No token: 401 naming the outbound endpoint's own metadata.
    let none = send(None, call("memory.append")).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{:?}", none.body);
    let challenge = none.headers["www-authenticate"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        challenge.contains("https://gateway.test/.well-known/oauth-protected-resource/mcp"),
        "{challenge}"
    );
    // A read-only token sees the read-only tool and may not append.
    let list = send(
        Some(token("memory:read")),
        modern_body(2, "tools/list", json!({})),
    )
    .await;
    let names: Vec<String> = list.json()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["memory.query"], "{}", list.json());
    let short = send(Some(token("memory:read")), call("memory.append")).await;
    assert_eq!(short.status, StatusCode::FORBIDDEN, "{:?}", short.body);
    assert!(short.headers["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("error=\"insufficient_scope\""));
    assert!(
        s.env.app.received().is_empty(),
        "nothing reached the tool host's app"
    );
    // The right scope: the call goes to the paired tool host, as the gateway.
    let ok = send(Some(token("memory")), call("memory.append")).await;
    assert_eq!(ok.json()["result"]["isError"], false, "{}", ok.json());
    let seen = s.env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-carapace-peer-id"], "gw_home");
    assert!(seen[0].headers.get("authorization").is_none());
    // The local socket still needs no token.
    let agent = Client::new(Transport::Unix(s.socket.clone()));
    let local = modern(&agent, &modern_body(3, "tools/list", json!({}))).await;
    assert_eq!(local.status, StatusCode::OK);
    s.gw.shutdown().await;
}
