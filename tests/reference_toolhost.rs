//! carapace's tools-v1 front answers as the reference tool host (crabstack's
//! `toolhost.ToolHost`) does, case by case from `../shared/vectors/crabstack/toolhost_http.json`:
//! the same HTTP status, and for call outcomes the same envelope (`status`, `error.code`,
//! `retryable`, `call_id`, `tool_name`, `result`). A gateway written for the reference (which
//! reads the envelope only from a 200 and retries only `retryable_error`) does the right thing
//! behind carapace. The few cases where carapace is stricter than the reference are listed
//! with their reason in `STRICTER`, and the README says the same.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::Env;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// The vectors' `vector-tools` host: `echo`, `panic` (no schemas, as the reference serves a
/// tool without them) and `sleep`, answering as the reference handler does. Its `sleep` has a
/// 300 ms maximum instead of 2 s, so the clamping case runs quickly.
struct VectorTools {
    received: Mutex<Vec<Value>>,
}

impl VectorTools {
    async fn start() -> (Arc<VectorTools>, std::net::SocketAddr) {
        let app = Arc::new(VectorTools {
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

    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let answer = match (req.method().clone(), req.uri().path()) {
            (Method::GET, "/v1/tools") => {
                json!({"version": "v1", "service": "vector-tools", "tools": [
                    {"name": "echo", "description": "Echo the args object back as result",
                     "input_schema": {"type": "object"}, "output_schema": {"type": "object"},
                     "timeout_ms_default": 1000, "timeout_ms_max": 5000, "idempotent": true, "side_effects": false},
                    {"name": "panic", "description": "Always panics (shows INTERNAL envelope)",
                     "input_schema": null, "output_schema": null,
                     "timeout_ms_default": 0, "timeout_ms_max": 0, "idempotent": false, "side_effects": false},
                    {"name": "sleep", "description": "Sleep args.ms milliseconds",
                     "input_schema": {"type": "object", "properties": {"ms": {"type": "integer"}}},
                     "output_schema": {"type": "object"},
                     "timeout_ms_default": 0, "timeout_ms_max": 300, "idempotent": false, "side_effects": false},
                ]})
            }
            (Method::POST, "/v1/tools/call") => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let call: Value = serde_json::from_slice(&body).unwrap();
                self.received.lock().unwrap().push(call.clone());
                let mut out = json!({"version": call["version"], "call_id": call["call_id"],
                    "tool_name": call["tool_name"], "status": "ok", "duration_ms": 0});
                match call["tool_name"].as_str() {
                    Some("echo") => out["result"] = call["args"].clone(),
                    Some("sleep") => {
                        let ms = call["args"]["ms"].as_u64().unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        out["result"] = json!({"slept_ms": ms});
                    }
                    _ => {
                        out["status"] = json!("error");
                        out["error"] = json!({"code": "INTERNAL", "message": "internal error"});
                    }
                }
                out
            }
            _ => json!({}),
        };
        let mut resp = Response::new(Full::new(Bytes::from(answer.to_string())));
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        resp
    }
}

/// Cases where carapace answers otherwise than the reference on purpose: id, HTTP status,
/// and the envelope's `status` and `error.code` (none for a 400 like the reference's other
/// malformed bodies), and why.
/// The envelope's `status` and `error.code`.
type Envelope = Option<(&'static str, &'static str)>;

const STRICTER: [(&str, u16, Envelope, &str); 4] = [
    (
        "call.args_not_object",
        200,
        Some(("error", "INVALID_ARGS")),
        "the protocol's request schema makes `args` an object; the reference takes any value",
    ),
    (
        "call.case_insensitive_keys",
        400,
        None,
        "member names are exact; the reference matches them case-insensitively",
    ),
    (
        "call.version_passthrough",
        200,
        Some(("error", "INVALID_ARGS")),
        "only v1 is spoken; the reference echoes any version",
    ),
    (
        "call.timeout_ms_zero_no_deadline",
        200,
        Some(("timeout", "TIMEOUT")),
        "a call without timeout_ms still stops at the tool's maximum; the reference runs it unbounded",
    ),
];

fn vectors() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/vectors/crabstack/toolhost_http.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = file["cases"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 27);
    cases
}

/// The fields of a call envelope a gateway acts on (an absent `retryable` is false; the
/// message is for people, but the reference's "missing required fields" text is kept).
fn envelope_essentials(v: &Value) -> Value {
    let message = v["error"]["message"].as_str().unwrap_or("");
    json!({
        "version": v["version"], "call_id": v["call_id"], "tool_name": v["tool_name"],
        "status": v["status"], "result": v["result"], "code": v["error"]["code"],
        "retryable": v["error"]["retryable"].as_bool().unwrap_or(false),
        "missing": message.find("missing required fields").map(|at| &message[at..]),
    })
}

#[tokio::test]
async fn every_reference_tool_host_case_is_answered_as_the_reference_answers_it() {
    let env = Env::new().await;
    let (app, addr) = VectorTools::start().await;
    let yaml = env.tools_yaml("").replace(
        &format!("http://{}", env.app_addr),
        &format!("http://{addr}"),
    );
    let r = env.start(&yaml).await;
    let gw = env.gateway(&r);
    let mut checked = 0;
    for case in vectors() {
        let id = case["id"].as_str().unwrap();
        let method = Method::from_bytes(case["method"].as_str().unwrap().as_bytes()).unwrap();
        let body = case["request_body"].as_str().unwrap_or("").to_string();
        let sent_before = app.received.lock().unwrap().len();
        let reply = gw
            .send(method, case["path"].as_str().unwrap(), &[], body)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&reply.body).to_string();
        let want_status = StatusCode::from_u16(case["status"].as_u64().unwrap() as u16).unwrap();
        let want_body = case["response_body"].as_str().unwrap();
        if let Some((_, status, envelope, why)) = STRICTER.iter().find(|s| s.0 == id) {
            assert_eq!(reply.status.as_u16(), *status, "{id}: {text}");
            if let Some((call_status, code)) = envelope {
                assert_eq!(reply.json()["status"], *call_status, "{id} ({why}): {text}");
                assert_eq!(reply.json()["error"]["code"], *code, "{id} ({why}): {text}");
            }
            // Refused before the app, but for the timeout, which is the app's own slowness.
            let reached = app.received.lock().unwrap().len() - sent_before;
            assert_eq!(reached, usize::from(id.contains("timeout")), "{id}");
            checked += 1;
            continue;
        }
        assert_eq!(reply.status, want_status, "{id}: {text}");
        if case["method"] == "HEAD" {
            // A HEAD answer has no body.
        } else if id == "discovery" {
            let list = reply.json();
            let names: Vec<&str> = list["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, ["echo", "panic", "sleep"], "{id}");
            assert_eq!(reply.json()["service"], "vector-tools");
        } else if let Ok(want) = serde_json::from_str::<Value>(want_body) {
            let got = reply.json();
            if want.get("status").is_some() {
                assert_eq!(
                    envelope_essentials(&got),
                    envelope_essentials(&want),
                    "{id}: {text}"
                );
                assert!(
                    carapace::tools_v1::follows_response_schema(&got),
                    "{id}: {text}"
                );
            } else {
                assert_eq!(got, want, "{id}");
            }
        } else {
            // The reference writes plain text for requests that are not calls; carapace
            // writes its envelope with the standard code, under the same status.
            assert_eq!(
                reply.json()["error"]["code"],
                "INVALID_ARGS",
                "{id}: {text}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 27);
}

/// What the reference marks retryable, and only that, is retryable behind carapace: a gateway
/// retries `retryable_error` (and a timeout, which carries `retryable: true`) and nothing else.
#[tokio::test]
async fn retryable_outcomes_are_marked_as_the_reference_marks_them() {
    let env = Env::new().await;
    let yaml = env.tools_yaml(
        "rate_limits: { per_peer: { per_second: 1, burst: 1 } }\ntools: { memory.query: { timeout_ms_max: 100 } }",
    );
    let r = env.start(&yaml).await;
    let gw = env.gateway(&r);
    let first = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("memory.append", json!({"text": "a"})),
        )
        .await
        .unwrap();
    assert_eq!(first.json()["status"], "ok");
    let limited = gw
        .post_json(
            "/v1/tools/call",
            &[],
            &common::call("memory.append", json!({"text": "b"})),
        )
        .await
        .unwrap();
    assert_eq!(limited.status, StatusCode::OK);
    assert_eq!(limited.json()["status"], "retryable_error");
    assert_eq!(limited.json()["error"]["code"], "RATE_LIMITED");
    assert_eq!(limited.json()["error"]["retryable"], true);
    assert!(limited.headers.contains_key("retry-after"));

    // The same refusal in the `http_status` style keeps its HTTP error status.
    r.shutdown().await;
    let yaml = env.tools_yaml(
        "rate_limits: { per_peer: { per_second: 1, burst: 1 } }\nfront: { protocol: tools-v1, answers: http_status }",
    );
    let yaml = yaml.replacen("front: { protocol: tools-v1 }\n", "", 1);
    let r = env.start(&yaml).await;
    let gw = env.gateway(&r);
    let call = common::call("memory.append", json!({"text": "c"}));
    gw.post_json("/v1/tools/call", &[], &call).await.unwrap();
    let limited = gw.post_json("/v1/tools/call", &[], &call).await.unwrap();
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.json()["status"], "retryable_error");
    r.shutdown().await;
}
