//! Skill Gateway v1: the skill-v1 front (`/manifest`, signed `/run`) in front of a tools-v1 app,
//! and the skill-v1 back (a legacy `/run` skill) behind a tools-v1 front. Every test checks what
//! the caller got and what reached the app.

mod common;

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

// ---------------------------------------------------------------------------------------------
// 1. The Vagus wire vectors, end to end.

/// The Vagus vectors carapace refuses on purpose: id, status, error code.
const REFUSED_VECTORS: [(&str, StatusCode, &str); 4] = [
    // The body is not valid Unicode.
    (
        "v14_lone_surrogate",
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    ),
    // A `__proto__` member is not covered by the signature.
    (
        "v28_proto_key_nested_object",
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    ),
    (
        "v29_proto_key_primitive",
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    ),
    // Empty secrets cannot be configured, and the configured keys do not match.
    (
        "v35_empty_secret",
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    ),
];

#[tokio::test]
async fn every_vagus_wire_vector_is_accepted_except_the_documented_refusals() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/vectors/vagus/canonical_hmac_vectors.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vectors = file["vectors"].as_array().unwrap();
    assert_eq!(vectors.len(), 38);

    let env = Env::new().await;
    let mut secrets: Vec<&str> = vectors
        .iter()
        .map(|v| v["secret"].as_str().unwrap())
        .filter(|s| !s.is_empty())
        .collect();
    secrets.sort();
    secrets.dedup();
    let keys: Vec<PathBuf> = secrets
        .iter()
        .enumerate()
        .map(|(i, s)| secret_file(env.path(), &format!("secret{i}"), s.as_bytes()))
        .collect();
    let auth = auth_yaml("hmac", &keys, ", nonce_capacity: 16");

    let mut accepted = 0;
    for (i, v) in vectors.iter().enumerate() {
        let id = v["id"].as_str().unwrap();
        let fields = &v["request_fields"];
        let wire = v["wire_body"].as_str().unwrap();
        let sig = v["signature_hex"].as_str().unwrap();
        // A fresh carapace per vector: they share one nonce.
        let (app, addr) = EchoApp::start(fields["capability"].as_str().unwrap()).await;
        let yaml = front_yaml(
            &env.path().join(format!("s{i}")),
            fields["skill_id"].as_str().unwrap(),
            &auth,
            addr,
        );
        let (_, clock) = clock_at(fields["timestamp"].as_u64().unwrap());
        let r = env.start_clocked(&yaml, true, clock).await;

        if let Some(&(_, status, error_code)) = REFUSED_VECTORS.iter().find(|r| r.0 == id) {
            let reply = run(&r, &[("X-Skill-Signature", sig)], wire.to_string()).await;
            assert_refused(&reply, status, error_code);
            assert!(app.received().is_empty(), "{id} reached the app");
        } else {
            // A tampered copy first: refused, and it does not burn the nonce.
            let bad = tamper(sig);
            let tampered = wire.replace(
                &format!(r#""signature":"{sig}""#),
                &format!(r#""signature":"{bad}""#),
            );
            assert_ne!(tampered, wire, "{id}");
            let reply = run(&r, &[("X-Skill-Signature", &bad)], tampered).await;
            assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
            assert!(app.received().is_empty(), "tampered {id} reached the app");

            let reply = run(&r, &[("X-Skill-Signature", sig)], wire.to_string()).await;
            assert_ok(&reply);
            let input = serde_json::from_str::<Value>(wire).unwrap()["input"].clone();
            assert_eq!(reply.json()["output"], json!({ "echo": input }), "{id}");
            let seen = app.received();
            assert_eq!(seen.len(), 1, "{id}");
            assert_eq!(seen[0]["tool_name"], fields["capability"], "{id}");
            assert_eq!(seen[0]["args"], input, "{id}");
            accepted += 1;
        }
        r.shutdown().await;
    }
    assert_eq!(accepted, 34);
}

// ---------------------------------------------------------------------------------------------
// 2. Failed checks.

#[tokio::test]
async fn requests_failing_a_check_never_reach_the_app() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;
    let refused = |reply: Reply, status: StatusCode, error_code: &'static str| {
        assert_refused(&reply, status, error_code);
        assert!(
            env.app.received().is_empty(),
            "{error_code} reached the app"
        );
        reply
    };

    // Signed with another secret.
    let body = append(b"not-the-secret", "a", NOW);
    refused(
        run_signed(&r, &body).await,
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    );

    // A correct body signature, another one in the header.
    let body = append(SECRET, "a", NOW);
    let other = "00".repeat(32);
    let reply = run(&r, &[("X-Skill-Signature", &other)], body.to_string()).await;
    refused(reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");

    // The signature header twice (the right value first): which one would be checked?
    let body = append(SECRET, "a", NOW);
    let sig = body["signature"].as_str().unwrap().to_string();
    let reply = run(
        &r,
        &[("X-Skill-Signature", &sig), ("X-Skill-Signature", &other)],
        body.to_string(),
    )
    .await;
    refused(reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    let reply = run(
        &r,
        &[("X-Skill-Signature", &sig), ("X-Skill-Signature", &sig)],
        body.to_string(),
    )
    .await;
    refused(reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");

    // No signature at all.
    let mut body = append(SECRET, "a", NOW);
    body.as_object_mut().unwrap().remove("signature");
    refused(
        run(&r, &[], body.to_string()).await,
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    );

    // A wrong method on a known route.
    let reply = Client::new(Transport::Tcp(r.tcp_address.unwrap()))
        .send(Method::GET, "/run", &[], "")
        .await
        .unwrap();
    refused(reply, StatusCode::METHOD_NOT_ALLOWED, "ROUTING_FAILED");

    // Outside the ±120 s window, either way.
    for ts in [NOW - 121_000, NOW + 121_000] {
        let reply = refused(
            run_signed(&r, &append(SECRET, "a", ts)).await,
            StatusCode::BAD_REQUEST,
            "NONCE_REPLAY",
        );
        let message = reply.json()["message"].as_str().unwrap().to_string();
        assert!(message.contains("window"), "{message}");
    }

    // A top-level field the signature does not cover.
    let mut body = append(SECRET, "a", NOW);
    body["debug"] = json!(true);
    refused(
        run_signed(&r, &body).await,
        StatusCode::UNAUTHORIZED,
        "SKILL_AUTH_FAILED",
    );

    // Another protocol version, correctly signed.
    let mut body = append(SECRET, "a", NOW);
    body["gateway_protocol_version"] = json!("2.0");
    resign(SECRET, &mut body);
    refused(
        run_signed(&r, &body).await,
        StatusCode::BAD_REQUEST,
        "PROTOCOL_VERSION_UNSUPPORTED",
    );

    // Another skill.
    let mut body = append(SECRET, "a", NOW);
    body["skill_id"] = json!("other.skill");
    resign(SECRET, &mut body);
    refused(
        run_signed(&r, &body).await,
        StatusCode::NOT_FOUND,
        "ROUTING_FAILED",
    );

    // A capability the app does not have.
    let mut body = append(SECRET, "a", NOW);
    body["capability"] = json!("memory.drop_all");
    resign(SECRET, &mut body);
    refused(
        run_signed(&r, &body).await,
        StatusCode::NOT_FOUND,
        "ROUTING_FAILED",
    );

    // Input breaking the tool's schema.
    let mut body = append(SECRET, "a", NOW);
    body["input"] = json!({"text": 5});
    resign(SECRET, &mut body);
    let reply = refused(
        run_signed(&r, &body).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );
    let violations = &reply.json()["details"]["violations"];
    assert!(
        violations.as_array().is_some_and(|v| !v.is_empty()),
        "{}",
        reply.json()
    );

    // A duplicate member: which value would have been verified?
    let body = append(SECRET, "a", NOW);
    let sig = body["signature"].as_str().unwrap();
    let text = body.to_string();
    let duplicated = text.replace(
        r#""input":{"text":"a"}"#,
        r#""input":{"text":"a","text":"b"}"#,
    );
    assert_ne!(duplicated, text);
    refused(
        run(&r, &[("X-Skill-Signature", sig)], duplicated).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );

    // An integer beyond 2^53 where a signed one was: JS would sign both as the same double,
    // so the body the app would read is not the one that was signed.
    let mut body = append(SECRET, "a", NOW);
    body["input"] = json!({"text": "a", "n": 9_007_199_254_740_992_u64});
    resign(SECRET, &mut body);
    let sig = body["signature"].as_str().unwrap().to_string();
    let text = body.to_string();
    let swapped = text.replace("9007199254740992", "9007199254740993");
    assert_ne!(swapped, text);
    refused(
        run(&r, &[("X-Skill-Signature", &sig)], swapped).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );
    // A number literal no double needs.
    let long = format!("0.{}1", "0".repeat(60));
    let padded = text.replace("9007199254740992", &long);
    refused(
        run(&r, &[("X-Skill-Signature", &sig)], padded).await,
        StatusCode::BAD_REQUEST,
        "SCHEMA_VALIDATION_FAILED",
    );

    // Inside the window (119 s late): accepted and forwarded.
    let reply = run_signed(&r, &append(SECRET, "late", NOW - 119_000)).await;
    assert_ok(&reply);
    let seen = env.app.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body["args"], json!({"text": "late"}));
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 3. Replay.

#[tokio::test]
async fn a_replayed_request_is_refused_and_a_forged_one_does_not_burn_its_nonce() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;

    let body = append(SECRET, "once", NOW);
    assert_ok(&run_signed(&r, &body).await);
    let reply = run_signed(&r, &body).await;
    assert_refused(&reply, StatusCode::BAD_REQUEST, "NONCE_REPLAY");
    assert_eq!(env.app.received().len(), 1);

    // A forgery carrying nonce N is refused without recording N...
    let honest = append(SECRET, "honest", NOW);
    let mut forged = honest.clone();
    forged["input"] = json!({"text": "forged"});
    let reply = run_signed(&r, &forged).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    assert_eq!(env.app.received().len(), 1);
    // ...so the honest request with N still goes through.
    assert_ok(&run_signed(&r, &honest).await);
    let seen = env.app.received();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].body["args"], json!({"text": "honest"}));
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 4. Key rotation.

#[tokio::test]
async fn every_configured_key_is_accepted_and_an_unknown_one_is_not() {
    let env = Env::new().await;
    let keys = [
        secret_file(env.path(), "old", b"old-secret"),
        secret_file(env.path(), "new", b"new-secret"),
    ];
    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("hmac", &keys, ""),
        env.app_addr,
    );
    let (_, clock) = clock_at(NOW);
    let r = env.start_clocked(&yaml, true, clock).await;

    assert_ok(&run_signed(&r, &append(b"old-secret", "old", NOW)).await);
    assert_ok(&run_signed(&r, &append(b"new-secret", "new", NOW)).await);
    let reply = run_signed(&r, &append(b"retired-secret", "retired", NOW)).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");

    let texts: Vec<Value> = env
        .app
        .received()
        .iter()
        .map(|c| c.body["args"]["text"].clone())
        .collect();
    assert_eq!(texts, [json!("old"), json!("new")]);
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 5. API key mode.

/// A `/run` body as Vagus sends it in api_key mode: the signature is the literal `api_key`.
fn api_key_run(text: &str) -> String {
    let mut body = append(SECRET, text, NOW);
    body["signature"] = json!("api_key");
    body.to_string()
}

#[tokio::test]
async fn api_key_mode_checks_the_key_header() {
    let env = Env::new().await;
    let key = secret_file(env.path(), "api", b"the-api-key");
    let (_, clock) = clock_at(NOW);

    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("api_key", std::slice::from_ref(&key), ""),
        env.app_addr,
    );
    let r = env.start_clocked(&yaml, true, clock.clone()).await;
    assert_ok(&run(&r, &[("X-API-Key", "the-api-key")], api_key_run("right")).await);
    let reply = run(&r, &[("X-API-Key", "the-api-kex")], api_key_run("wrong")).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    let reply = run(&r, &[], api_key_run("missing")).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    r.shutdown().await;
    assert_eq!(env.app.received().len(), 1);

    // A custom header name: the key is read there and nowhere else.
    let yaml = front_yaml(
        &env.path().join("state2"),
        SKILL,
        &auth_yaml("api_key", &[key], ", header_name: X-Skill-Key"),
        env.app_addr,
    );
    let r = env.start_clocked(&yaml, true, clock).await;
    let reply = run(&r, &[("X-API-Key", "the-api-key")], api_key_run("default")).await;
    assert_refused(&reply, StatusCode::UNAUTHORIZED, "SKILL_AUTH_FAILED");
    assert_ok(&run(&r, &[("X-Skill-Key", "the-api-key")], api_key_run("custom")).await);
    r.shutdown().await;

    let texts: Vec<Value> = env
        .app
        .received()
        .iter()
        .map(|c| c.body["args"]["text"].clone())
        .collect();
    assert_eq!(texts, [json!("right"), json!("custom")]);
}

// ---------------------------------------------------------------------------------------------
// 6. Restart.

#[tokio::test]
async fn a_restart_does_not_reopen_the_replay_window() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;
    let body = append(SECRET, "once", NOW);
    assert_ok(&run_signed(&r, &body).await);
    r.shutdown().await;

    // The same configuration, state directory and time.
    let (r, _) = hmac_front(&env, "").await;
    let reply = run_signed(&r, &body).await;
    assert_refused(&reply, StatusCode::BAD_REQUEST, "NONCE_REPLAY");
    assert_eq!(env.app.received().len(), 1);
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 7. The bounded nonce store.

#[tokio::test]
async fn a_full_nonce_store_refuses_new_requests_and_forgets_no_live_nonce() {
    let env = Env::new().await;
    let (r, now) = hmac_front(
        &env,
        ", timestamp_skew_s: 60, nonce_ttl_s: 120, nonce_capacity: 2",
    )
    .await;

    let first = append(SECRET, "1", NOW);
    let second = append(SECRET, "2", NOW);
    assert_ok(&run_signed(&r, &first).await);
    assert_ok(&run_signed(&r, &second).await);

    let reply = run_signed(&r, &append(SECRET, "3", NOW)).await;
    assert_refused(&reply, StatusCode::SERVICE_UNAVAILABLE, "SKILL_HTTP_ERROR");
    let retry_after: u64 = reply.headers[http::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=120).contains(&retry_after), "{retry_after}");

    // The accepted nonces were not evicted to make room.
    for body in [&first, &second] {
        let reply = run_signed(&r, body).await;
        assert_refused(&reply, StatusCode::BAD_REQUEST, "NONCE_REPLAY");
    }
    assert_eq!(env.app.received().len(), 2);

    // Once the TTL has passed there is room again.
    let later = NOW + 121_000;
    now.store(later, Ordering::SeqCst);
    assert_ok(&run_signed(&r, &append(SECRET, "4", later)).await);
    let seen = env.app.received();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].body["args"], json!({"text": "4"}));
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 8. Manifest.

#[tokio::test]
async fn the_manifest_lists_the_apps_tools_as_capabilities() {
    let env = Env::new().await;
    let (r, _) = hmac_front(&env, "").await;
    let reply = Client::new(Transport::Tcp(r.tcp_address.unwrap()))
        .send(Method::GET, "/manifest", &[], "")
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    let m = reply.json();
    assert_eq!(m["id"], SKILL);
    assert_eq!(m["gateway_protocol_version"], "1.0");
    assert_eq!(m["requires"]["auth"], "hmac-sha256");
    let catalog = carapace::memory_app::catalog();
    let expected: Vec<Value> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            json!({
                "capability": t["name"],
                "description": t["description"],
                "input_schema": t["input_schema"],
                "output_schema": t["output_schema"],
            })
        })
        .collect();
    let mut caps = m["capabilities"].as_array().unwrap().clone();
    caps.sort_by_key(|c| c["capability"].to_string());
    let mut expected = expected;
    expected.sort_by_key(|c| c["capability"].to_string());
    assert_eq!(caps, expected);
    assert!(env.app.received().is_empty());
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 9. The skill-v1 back.

/// What carapace sent the skill must be a fresh, signed `/run` for `demo.echo` with `input`.
fn assert_signed_run(headers: &http::HeaderMap, body: &Value, input: Value) {
    assert_eq!(body["gateway_protocol_version"], "1.0");
    assert_eq!(body["skill_id"], SKILL);
    assert_eq!(body["capability"], SKILL);
    assert_eq!(body["input"], input);
    let ts = body["timestamp"].as_u64().expect("timestamp in ms");
    assert!(
        ts.abs_diff(carapace_filters::unix_now_ms()) < 60_000,
        "{ts}"
    );
    let nonce = body["nonce"].as_str().unwrap();
    assert!(
        nonce.len() == 32
            && nonce
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{nonce}"
    );
    let sig = body["signature"].as_str().unwrap();
    let mut unsigned = body.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    let canonical = canonical_string(&unsigned).unwrap();
    assert!(verify_hmac_sha256_hex(SECRET, canonical.as_bytes(), sig));
    assert_eq!(headers["x-skill-signature"], sig);
    assert_eq!(
        headers
            .get_all("x-carapace-peer-id")
            .iter()
            .collect::<Vec<_>>(),
        ["gw_test"]
    );
}

#[tokio::test]
async fn a_legacy_skill_is_served_as_a_tools_v1_tool_for_both_manifest_shapes() {
    for manifest in [SkillApp::vagus_manifest(), SkillApp::text_manifest()] {
        let env = Env::new().await;
        let (skill, addr) = SkillApp::start(SECRET, manifest.clone()).await;
        let secret = secret_file(env.path(), "skill-secret", SECRET);
        let r = env.start(&back_yaml(&env, addr, &secret)).await;
        let gw = env.gateway(&r);

        let reply = gw.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        let tools = reply.json()["tools"].as_array().unwrap().clone();
        assert_eq!(tools.len(), 1, "{tools:?}");
        assert_eq!(tools[0]["name"], SKILL);
        let input_schema = match &manifest["input_schema"] {
            Value::Null => manifest["capabilities"][0]["input_schema"].clone(),
            s => s.clone(),
        };
        assert_eq!(tools[0]["input_schema"], input_schema);

        let reply = gw
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(reply.json()["status"], "ok");
        assert_eq!(reply.json()["result"], json!({"result": "echo:hi"}));
        {
            let seen = skill.received.lock().unwrap();
            assert_eq!(seen.len(), 1);
            assert_signed_run(&seen[0].0, &seen[0].1, json!({"message": "hi"}));
        }

        // Bad arguments never reach the skill.
        let reply = gw
            .post_json("/v1/tools/call", &[], &call(SKILL, json!({"message": 5})))
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(code(&reply), "INVALID_ARGS");
        assert_eq!(reply.json()["error"]["details"]["reason"], "input_schema");
        assert_eq!(skill.received.lock().unwrap().len(), 1);

        // The skill's own error is passed on.
        *skill.answer.lock().unwrap() = Some((
            200,
            json!({"ok": false, "error_code": "WORKER_BUSY", "message": "busy"}),
        ));
        let reply = gw
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "error", "{}", reply.json());
        assert_eq!(code(&reply), "WORKER_BUSY");

        // Output breaking the output schema is withheld.
        *skill.answer.lock().unwrap() = Some((200, json!({"ok": true, "output": {"wrong": 1}})));
        let reply = gw
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE");
        assert_eq!(reply.json()["error"]["details"]["reason"], "output_schema");
        assert!(reply.json().get("result").is_none(), "{}", reply.json());
        assert!(
            !String::from_utf8_lossy(&reply.body).contains(r#""wrong":1"#),
            "{}",
            reply.json()
        );
        assert_eq!(skill.received.lock().unwrap().len(), 3);
        r.shutdown().await;

        // With the wrong secret, the skill answers 401: that is carapace's misconfiguration,
        // not the caller's failed authentication, so the caller gets a dependency failure
        // (as the Vagus client turns any non-2xx into an HTTP error) and no result.
        *skill.answer.lock().unwrap() = None;
        let wrong = secret_file(env.path(), "wrong-secret", b"not-the-skill-secret");
        let r = env.start(&back_yaml(&env, addr, &wrong)).await;
        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        let body = reply.json();
        assert_eq!(reply.status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "error", "{body}");
        assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE", "{body}");
        assert_eq!(body["error"]["details"]["status"], 401, "{body}");
        assert!(body.get("result").is_none(), "{body}");
        assert_eq!(skill.received.lock().unwrap().len(), 4);
        r.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// 10. Discovery failures.

#[tokio::test]
async fn a_skill_with_an_unacceptable_manifest_never_becomes_ready() {
    let mut wrong_version = SkillApp::vagus_manifest();
    wrong_version["gateway_protocol_version"] = json!("2.0");
    let mut wrong_id = SkillApp::vagus_manifest();
    wrong_id["id"] = json!("other.skill");

    for manifest in [wrong_version, wrong_id] {
        let env = Env::new().await;
        let (skill, addr) = SkillApp::start(SECRET, manifest).await;
        let secret = secret_file(env.path(), "skill-secret", SECRET);
        let r = env.start_with(&back_yaml(&env, addr, &secret), false).await;
        // Wait until discovery has been tried and failed, then check readiness.
        wait_until(|| {
            r.shared
                .metrics
                .encode()
                .contains(r#"discoveries_total{result="failed"}"#)
        })
        .await;
        assert!(!r.shared.ready());
        let readyz = env
            .ops(&r)
            .send(Method::GET, "/readyz", &[], "")
            .await
            .unwrap();
        assert_eq!(readyz.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(readyz.json()["ready"], false);

        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call(SKILL, json!({"message": "hi"})),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE");
        assert_eq!(reply.json()["status"], "retryable_error");
        assert!(skill.received.lock().unwrap().is_empty());
        assert!(!r.shared.ready());
        r.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// An output withheld for breaking its schema must not come back inside the violation messages.

#[tokio::test]
async fn values_of_a_withheld_output_do_not_reach_the_caller() {
    let env = Env::new().await;
    let (skill, addr) = SkillApp::start(SECRET, SkillApp::vagus_manifest()).await;
    let secret = secret_file(env.path(), "skill-secret", SECRET);
    let r = env.start(&back_yaml(&env, addr, &secret)).await;
    // `result` must be a string; the skill puts an object holding a credential there.
    *skill.answer.lock().unwrap() = Some((
        200,
        json!({"ok": true, "output": {"result": {"api_key": "sk-live-5ecret"}}}),
    ));
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call(SKILL, json!({"message": "hi"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(code(&reply), "DEPENDENCY_UNAVAILABLE");
    assert_eq!(skill.received.lock().unwrap().len(), 1);
    assert!(
        !String::from_utf8_lossy(&reply.body).contains("sk-live-5ecret"),
        "withheld output reached the caller: {}",
        reply.json()
    );
    r.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The skill-v1 front's own names for timeouts and app HTTP failures.

#[tokio::test]
async fn a_slow_or_failing_app_gets_the_skill_v1_codes() {
    let env = Env::new().await;
    let key = secret_file(env.path(), "k0", SECRET);
    let yaml = front_yaml(
        &env.path().join("state"),
        SKILL,
        &auth_yaml("hmac", &[key], ""),
        env.app_addr,
    ) + "tools: { memory.query: { timeout_ms_max: 200 } }\n";
    let (_now, clock) = clock_at(NOW);
    let r = env.start_clocked(&yaml, true, clock).await;

    let slow = signed_run(
        SECRET,
        SKILL,
        "memory.query",
        json!({"query": "x", "delay_ms": 10000}),
        NOW,
        &nonce(),
    );
    let reply = run_signed(&r, &slow).await;
    assert_refused(&reply, StatusCode::GATEWAY_TIMEOUT, "SKILL_TIMEOUT");
    assert_eq!(reply.json()["details"]["timeout_ms"], 200);
    wait_until(|| env.app.abandoned() == 1).await;

    env.app
        .set_fault(Some(carapace::memory_app::Fault::Status(500)));
    let reply = run_signed(&r, &append(SECRET, "x", NOW)).await;
    assert_refused(&reply, StatusCode::BAD_GATEWAY, "SKILL_HTTP_ERROR");
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;
}

/// The local registry names the capabilities served: one the manifest adds is never served,
/// and the log says why.
#[tokio::test]
async fn a_capability_the_registry_does_not_name_is_never_served() {
    let env = Env::new().await;
    let mut manifest = SkillApp::vagus_manifest();
    let mut extra = manifest["capabilities"][0].clone();
    extra["capability"] = json!("demo.admin");
    manifest["capabilities"].as_array_mut().unwrap().push(extra);
    let (skill, addr) = SkillApp::start(SECRET, manifest).await;
    let secret = secret_file(env.path(), "skill-secret", SECRET);
    let r = env.start(&back_yaml(&env, addr, &secret)).await;
    let gw = env.gateway(&r);
    let list = gw.send(Method::GET, "/v1/tools", &[], "").await.unwrap();
    let names: Vec<String> = list.json()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, [SKILL]);
    let reply = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &call("demo.admin", json!({"message": "hi"})),
        )
        .await
        .unwrap();
    assert_eq!(code(&reply), "TOOL_NOT_FOUND", "{}", reply.json());
    assert!(skill.received.lock().unwrap().is_empty());
    r.shutdown().await;
}
