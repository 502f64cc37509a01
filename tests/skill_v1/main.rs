//! Skill Gateway v1: the skill-v1 front (`/manifest`, signed `/run`) in front of a tools-v1 app,
//! and the skill-v1 back (a legacy `/run` skill) behind a tools-v1 front. Every test checks what
//! the caller got and what reached the app.

mod back;
#[path = "../common/mod.rs"]
mod common;
mod front;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use carapace::client::{signed_run, Client, Reply, Transport};
use carapace::server::Running;
use carapace_filters::canonical::{canonical_string, hmac_sha256_hex, verify_hmac_sha256_hex};
use carapace_filters::signature::UnixClock;
use common::{call, code, wait_until, Env, SkillApp};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// 2025-01-01T00:00:00Z, the timestamp of most Vagus vectors.
const NOW: u64 = 1_735_689_600_000;
const SECRET: &[u8] = b"demo-secret";
const SKILL: &str = "demo.echo";

// ---------------------------------------------------------------------------------------------
// A tiny tools-v1 app: one tool with permissive schemas, answering `{"echo": args}`.

struct EchoApp {
    tool: String,
    received: Mutex<Vec<Value>>,
}

impl EchoApp {
    async fn start(tool: &str) -> (Arc<EchoApp>, SocketAddr) {
        let app = Arc::new(EchoApp {
            tool: tool.to_string(),
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

    fn received(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }

    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let answer = match (req.method().clone(), req.uri().path()) {
            (Method::GET, "/v1/tools") => json!({
                "version": "v1",
                "service": "echo",
                "tools": [{
                    "name": self.tool,
                    "description": "echo",
                    "input_schema": {"type": "object"},
                    "output_schema": {"type": "object"},
                }],
            }),
            (Method::POST, "/v1/tools/call") => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let body: Value = serde_json::from_slice(&body).unwrap();
                self.received.lock().unwrap().push(body.clone());
                json!({
                    "version": "v1",
                    "call_id": body["call_id"],
                    "tool_name": body["tool_name"],
                    "status": "ok",
                    "result": {"echo": body["args"]},
                    "duration_ms": 1,
                })
            }
            _ => json!({"error": "not found"}),
        };
        Response::new(Full::new(Bytes::from(answer.to_string())))
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration helpers.

/// Write `secret` to `<dir>/<name>` (no trailing newline) and return the path.
fn secret_file(dir: &Path, name: &str, secret: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, secret).unwrap();
    p
}

/// `auth:` of a skill-v1 front: `mode`, one key per file (`k0`, `k1`, ...), then `extra` keys.
fn auth_yaml(mode: &str, keys: &[PathBuf], extra: &str) -> String {
    let keys: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{{ id: k{i}, secret: {{ file: {} }} }}", p.display()))
        .collect();
    format!("{{ mode: {mode}, keys: [ {} ]{extra} }}", keys.join(", "))
}

/// A skill-v1 front on plain loopback TCP in front of the tools-v1 app at `app`.
fn front_yaml(state_dir: &Path, skill_id: &str, auth: &str, app: SocketAddr) -> String {
    format!(
        r#"
state_dir: {state}
front: {{ protocol: skill-v1, skill_id: {skill_id}, auth: {auth} }}
listeners: {{ tcp: {{ address: "127.0.0.1:0" }} }}
app: {{ protocol: tools-v1, address: "http://{app}" }}
ops: {{ address: "127.0.0.1:0" }}
"#,
        state = state_dir.display(),
    )
}

/// A tools-v1 front (mTLS + Unix socket, as `Env::tools_yaml`) over the skill-v1 skill at
/// `skill`, signing with the secret in `secret`.
fn back_yaml(env: &Env, skill: SocketAddr, secret: &Path) -> String {
    format!(
        r#"
state_dir: {d}/state
front: {{ protocol: tools-v1 }}
listeners:
  unix: {{ path: {d}/tools.sock }}
  tcp:
    address: "127.0.0.1:0"
    tls: {{ cert_file: {d}/server.crt, key_file: {d}/server.key, client_ca_file: {d}/ca.pem }}
app:
  protocol: skill-v1
  address: "http://{skill}"
  skill:
    skill_id: {SKILL}
    capabilities: [{SKILL}]
    auth: {{ mode: hmac, header_name: X-Skill-Signature, secret: {{ file: {secret} }} }}
peers: {{ file: {d}/peers.json }}
ops: {{ address: "127.0.0.1:0" }}
"#,
        d = env.path().display(),
        secret = secret.display(),
    )
}

/// A clock standing at `ms`, and the handle that moves it.
fn clock_at(ms: u64) -> (Arc<AtomicU64>, UnixClock) {
    let now = Arc::new(AtomicU64::new(ms));
    let c = now.clone();
    (now, Arc::new(move || c.load(Ordering::SeqCst)))
}

/// A skill-v1 front (HMAC, one key: `SECRET`, `extra` auth keys) over the memory app, with the
/// clock at `NOW`.
async fn hmac_front(env: &Env, extra: &str) -> (Running, Arc<AtomicU64>) {
    let key = secret_file(env.path(), "k0", SECRET);
    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("hmac", &[key], extra),
        env.app_addr,
    );
    let (now, clock) = clock_at(NOW);
    (env.start_clocked(&yaml, true, clock).await, now)
}

// ---------------------------------------------------------------------------------------------
// Request helpers.

fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// A `/run` body for `memory.append {"text": text}` at `ts`, signed with `secret`.
fn append(secret: &[u8], text: &str, ts: u64) -> Value {
    signed_run(
        secret,
        SKILL,
        "memory.append",
        json!({ "text": text }),
        ts,
        &nonce(),
    )
}

/// Sign `body` again with `secret` after its signed fields were changed.
fn resign(secret: &[u8], body: &mut Value) {
    body.as_object_mut().unwrap().remove("signature");
    let canonical = canonical_string(body).unwrap();
    body["signature"] = json!(hmac_sha256_hex(secret, canonical.as_bytes()));
}

/// `POST /run` on the plain loopback listener of a skill-v1 front.
async fn run(r: &Running, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
    Client::new(Transport::Tcp(r.tcp_address.expect("tcp listener")))
        .send(Method::POST, "/run", headers, body)
        .await
        .unwrap()
}

/// `POST /run` with a JSON body and its signature repeated in `X-Skill-Signature`, as Vagus
/// sends it.
async fn run_signed(r: &Running, body: &Value) -> Reply {
    let sig = body["signature"].as_str().unwrap_or_default();
    run(r, &[("X-Skill-Signature", sig)], body.to_string()).await
}

fn assert_ok(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["ok"], true, "{}", reply.json());
}

fn assert_refused(reply: &Reply, status: StatusCode, error_code: &str) {
    assert_eq!(reply.status, status, "{}", reply.json());
    assert_eq!(reply.json()["ok"], false, "{}", reply.json());
    assert_eq!(code(reply), error_code, "{}", reply.json());
}

/// The signature with its first hex digit changed.
fn tamper(sig: &str) -> String {
    let first = if sig.starts_with('0') { '1' } else { '0' };
    format!("{first}{}", &sig[1..])
}
