//! Shared harness for integration tests: certificates, the sample memory app, a fake legacy
//! skill, and a carapace started in-process on loopback (port 0) and Unix sockets.
#![allow(dead_code)]

pub mod mcp;
pub mod node;
pub mod oauth;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use carapace::client::{tls_config, Client, Transport};
use carapace::memory_app::MemoryApp;
use carapace::pki::{Authority, Issued};
use carapace::server::{self, Running};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// Certificates: a gateway CA, carapace's server certificate, the paired gateway's client
/// certificate and an unpaired one from the same CA.
pub struct Pki {
    pub ca: Authority,
    pub server: Issued,
    pub gateway: Issued,
    pub stranger: Issued,
}

impl Pki {
    pub fn new() -> Self {
        let ca = Authority::new("test gateway CA");
        Pki {
            server: ca.server(&["127.0.0.1", "localhost"]),
            gateway: ca.client("gw_test"),
            stranger: ca.client("stranger"),
            ca,
        }
    }
}

/// A test environment: a temporary directory, certificates, and a running memory app.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub pki: Pki,
    pub app: Arc<MemoryApp>,
    pub app_addr: std::net::SocketAddr,
    _app_task: tokio::task::JoinHandle<()>,
}

impl Env {
    pub async fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new();
        let d = dir.path();
        std::fs::write(d.join("ca.pem"), pki.ca.cert_pem()).unwrap();
        std::fs::write(d.join("server.crt"), &pki.server.cert_pem).unwrap();
        std::fs::write(d.join("server.key"), &pki.server.key_pem).unwrap();
        write_peers(
            &d.join("peers.json"),
            &[(&pki.gateway.fingerprint, "gw_test", "active")],
        );
        let app = Arc::new(MemoryApp::default());
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app_addr = l.local_addr().unwrap();
        let task = app.serve(l);
        Env {
            dir,
            pki,
            app,
            app_addr,
            _app_task: task,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A tools-v1 front (mTLS TCP + Unix socket) over the memory app, plus `extra` top-level
    /// YAML keys.
    pub fn tools_yaml(&self, extra: &str) -> String {
        format!(
            r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners:
  unix: {{ path: {d}/tools.sock }}
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {d}/server.crt, key_file: {d}/server.key, client_ca_file: {d}/ca.pem }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "127.0.0.1:0" }}
{extra}
"#,
            d = self.path().display(),
            app = self.app_addr
        )
    }

    /// Write `yaml` to `<dir>/carapace.yaml` and start carapace from it; waits until ready
    /// unless `wait_ready` is false.
    pub async fn start_with(&self, yaml: &str, wait_ready: bool) -> Running {
        self.start_clocked(yaml, wait_ready, Arc::new(carapace_filters::unix_now_ms))
            .await
    }

    pub async fn start_clocked(
        &self,
        yaml: &str,
        wait_ready: bool,
        clock: carapace_filters::signature::UnixClock,
    ) -> Running {
        let path = self.path().join("carapace.yaml");
        std::fs::write(&path, yaml).unwrap();
        let loaded = carapace::config::load(&path).unwrap_or_else(|e| {
            panic!(
                "config: {:?}",
                e.0.iter().map(|e| e.to_string()).collect::<Vec<_>>()
            )
        });
        let running = server::start_with_clock(loaded, clock).await.unwrap();
        if wait_ready {
            wait_until(|| running.shared.ready()).await;
        }
        running
    }

    pub async fn start(&self, yaml: &str) -> Running {
        self.start_with(yaml, true).await
    }

    /// HTTP/1.1 over mTLS as `who`.
    pub fn tls_client(&self, r: &Running, who: Option<&Issued>, h2: bool) -> Client {
        Client::new(Transport::Tls {
            address: r.tcp_address.expect("tcp listener"),
            config: tls_config(&self.pki.ca.cert_pem(), who, h2),
        })
    }

    /// The paired gateway over mTLS, HTTP/1.1.
    pub fn gateway(&self, r: &Running) -> Client {
        self.tls_client(r, Some(&self.pki.gateway), false)
    }

    /// A local caller on the Unix socket.
    pub fn local(&self, r: &Running) -> Client {
        Client::new(Transport::Unix(r.unix_path.clone().expect("unix listener")))
    }

    /// The ops endpoint.
    pub fn ops(&self, r: &Running) -> Client {
        Client::new(Transport::Tcp(r.ops_address.expect("ops listener")))
    }
}

/// A free loopback port, bound and released, for a listener whose address must be known
/// before it starts (a child process, a URL in the configuration).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Write a peer store with `(fingerprint, component_id, status)` records.
pub fn write_peers(path: &Path, peers: &[(&str, &str, &str)]) {
    let peers: Vec<Value> = peers
        .iter()
        .map(|(fp, id, status)| {
            json!({"component_type": "gateway", "component_id": id, "role": "gateway",
                   "mtls_cert_fingerprint": fp, "status": status})
        })
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json!({"version": 1, "peers": peers}).to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Poll `cond` every 10 ms for up to 5 s.
pub async fn wait_until(cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 5 s");
}

/// A tools-v1 call request.
pub fn call(tool: &str, args: Value) -> Value {
    json!({
        "version": "v1",
        "call_id": format!("c-{}", hex::encode(rand::random::<[u8; 6]>())),
        "tool_name": tool,
        "tenant_id": "home",
        "args": args,
        "context": {"agent_id": "assistant", "session_id": "ses_1"},
    })
}

/// The tools-v1 error code of a reply (`error.code`) or the skill-v1 one (`error_code`).
pub fn code(r: &carapace::client::Reply) -> String {
    let v = r.json();
    v["error"]["code"]
        .as_str()
        .or(v["error_code"].as_str())
        .unwrap_or("")
        .to_string()
}

/// A legacy Skill Gateway v1 skill: serves a manifest and `/run`, checks HMAC with its own
/// secret exactly as the Vagus demo worker does, and records what reached it.
pub struct SkillApp {
    pub secret: Vec<u8>,
    pub manifest: Mutex<Value>,
    pub received: Mutex<Vec<(http::HeaderMap, Value)>>,
    /// Answer with this body instead of echoing (to test error passing).
    pub answer: Mutex<Option<(u16, Value)>>,
}

impl SkillApp {
    /// The manifest shape the public Vagus code serves: capabilities as objects.
    pub fn vagus_manifest() -> Value {
        json!({
            "gateway_protocol_version": "1.0",
            "id": "demo.echo",
            "version": "1.0.0",
            "capabilities": [{
                "capability": "demo.echo",
                "description": "Echo demo worker",
                "input_schema": {"type": "object", "properties": {"message": {"type": "string"}, "mode": {"type": "string"}}, "required": ["message"], "additionalProperties": false},
                "output_schema": {"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"], "additionalProperties": false}
            }],
            "requires": {"auth": "hmac-sha256"},
            "safety": {"data_handling": "no_secrets"}
        })
    }

    /// The shape the protocol text gives: capabilities as strings, schemas at the top.
    pub fn text_manifest() -> Value {
        json!({
            "gateway_protocol_version": "1.0",
            "id": "demo.echo",
            "version": "1.0.0",
            "capabilities": ["demo.echo"],
            "input_schema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"], "additionalProperties": false},
            "output_schema": {"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"], "additionalProperties": false},
            "requires": {"auth": "hmac-sha256"}
        })
    }

    pub async fn start(secret: &[u8], manifest: Value) -> (Arc<SkillApp>, std::net::SocketAddr) {
        let app = Arc::new(SkillApp {
            secret: secret.to_vec(),
            manifest: Mutex::new(manifest),
            received: Mutex::new(Vec::new()),
            answer: Mutex::new(None),
        });
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let a = app.clone();
        serve_http1(l, move |req| {
            let a = a.clone();
            async move { a.handle(req).await }
        });
        (app, addr)
    }

    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let reply = |status: u16, v: Value| {
            let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
            *r.status_mut() = StatusCode::from_u16(status).unwrap();
            r
        };
        match req.uri().path() {
            "/manifest" => reply(200, self.manifest.lock().unwrap().clone()),
            "/run" => {
                let headers = req.headers().clone();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let mut v: Value = serde_json::from_slice(&body).unwrap();
                self.received.lock().unwrap().push((headers, v.clone()));
                let sig = v
                    .as_object_mut()
                    .unwrap()
                    .remove("signature")
                    .and_then(|s| s.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let canonical = carapace_filters::canonical::canonical_string(&v).unwrap();
                if !carapace_filters::canonical::verify_hmac_sha256_hex(
                    &self.secret,
                    canonical.as_bytes(),
                    &sig,
                ) {
                    return reply(
                        401,
                        json!({"ok": false, "error_code": "SKILL_AUTH_FAILED", "message": "bad signature"}),
                    );
                }
                if let Some((status, body)) = self.answer.lock().unwrap().clone() {
                    return reply(status, body);
                }
                let msg = v["input"]["message"].as_str().unwrap_or("").to_string();
                reply(
                    200,
                    json!({"ok": true, "output": {"result": format!("echo:{msg}")}, "meta": {"worker": "demo.echo"}}),
                )
            }
            _ => reply(
                404,
                json!({"ok": false, "error_code": "NOT_FOUND", "message": "route not found"}),
            ),
        }
    }
}

/// Serve HTTP/1.1 on `listener` with `handler` until the runtime ends.
pub fn serve_http1<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let fut = handler(req);
                    async move { Ok::<_, std::convert::Infallible>(fut.await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
}

/// Path of the carapace binary built for these tests.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_carapace"))
}

/// The rows of the ledger of the configuration `env` started last (`carapace ledger export`).
pub fn ledger_rows(env: &Env) -> Vec<Value> {
    ledger_rows_of(&env.path().join("carapace.yaml"))
}

/// The rows of the ledger of the configuration file `config`.
pub fn ledger_rows_of(config: &Path) -> Vec<Value> {
    let out = std::process::Command::new(binary())
        .args(["ledger", "export", "--config"])
        .arg(config)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Send the tools-v1 call `body` (a slow one) on `client`, cancel it once the app has
/// received `received` calls, and return the call's answer.
pub async fn cancelled_in_flight(
    env: &Env,
    client: &Client,
    body: Value,
    received: usize,
) -> carapace::client::Reply {
    let cancel = json!({"version": "v1", "call_id": body["call_id"]});
    let held = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .post_json("/v1/tools/call", &[], &body)
                .await
                .unwrap()
        }
    });
    wait_until(|| env.app.received().len() == received).await;
    let cancelled = client
        .post_json("/v1/tools/cancel", &[], &cancel)
        .await
        .unwrap();
    assert_eq!(cancelled.json()["cancelled"], true);
    held.await.unwrap()
}

/// Pair the tool host `host` (pairing endpoint on loopback) as `component_id` with the
/// gateway `gw`, through the gateway's admin socket; panics unless it succeeds.
#[allow(dead_code)]
pub async fn pair_through_admin(gw: &Running, host: &Running, component_id: &str) {
    let (status, result) = carapace::admin::request(
        &gw.admin_socket,
        http::Method::POST,
        "/v1/pairings",
        Some(
            json!({"component_type": "tool", "component_id": component_id,
                    "endpoint": format!("ws://{}/v1/pair", host.pairing_address.unwrap())}),
        ),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{result}");
}

/// A tool host (the env's tools-v1 front plus `host_extra`) paired with a gateway at
/// `<env>/gw` whose outbound role calls it as `memory-east` (at `via(host listener)`, default
/// the host's listener; `peer_extra` is added inside the peer's map, `outbound_extra` under
/// `outbound`).
/// Returns (host, gateway, the agent's client), the host's tools listed by the gateway.
#[allow(dead_code)]
pub async fn paired(
    env: &Env,
    host_extra: &str,
    peer_extra: &str,
    outbound_extra: &str,
    via: Option<&dyn Fn(std::net::SocketAddr) -> std::net::SocketAddr>,
) -> (Running, Running, Client) {
    write_peers(&env.path().join("peers.json"), &[]);
    let gw_dir = env.path().join("gw");
    std::fs::create_dir_all(gw_dir.join("state")).unwrap();
    let gw_key = carapace::pairing::identity::GatewayIdentity::load_or_create(
        &gw_dir.join("state"),
        "gw_home",
    )
    .unwrap()
    .public_key_ed25519();
    let host = env
        .start(&env.tools_yaml(&format!(
            "pairing: {{ listen: \"127.0.0.1:0\", component_id: memory-east, gateway_public_key_ed25519: \"{gw_key}\" }}\n{host_extra}"
        )))
        .await;
    let yaml = format!(
        r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {d}/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "" }}
gateway: {{ id: gw_home }}
outbound:
  socket: {d}/outbound.sock
  peers: {{ memory-east: {{ url: "https://{tools}"{peer_extra} }} }}
{outbound_extra}
"#,
        d = gw_dir.display(),
        app = env.app_addr,
        tools = via.map_or(host.tcp_address.unwrap(), |f| f(host.tcp_address.unwrap())),
    );
    std::fs::write(gw_dir.join("carapace.yaml"), yaml).unwrap();
    let gw = server::start(carapace::config::load(&gw_dir.join("carapace.yaml")).unwrap())
        .await
        .unwrap();
    pair_through_admin(&gw, &host, "memory-east").await;
    // A pairing is reported once the gateway has listed the host's tools.
    let agent = Client::new(Transport::Unix(gw_dir.join("outbound.sock")));
    let list = agent
        .send(http::Method::GET, "/v1/tools", &[], "")
        .await
        .unwrap();
    let tools = list.json()["tools"].as_array().cloned().unwrap_or_default();
    assert!(!tools.is_empty(), "no tools listed: {:?}", list.json());
    (host, gw, agent)
}
