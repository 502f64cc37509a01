//! A sample tools-v1 memory tool host (`memory.append`, `memory.query`, `memory.delete`).
//!
//! `carapace demo` runs it behind carapace; integration tests use it as the app and read what
//! reached it. It can be told to misbehave (wrong output, HTTP errors, hanging) to show what
//! carapace does about an app that breaks its contract.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::{TcpListener, UnixListener};

/// The catalog the app serves on `GET /v1/tools`.
pub fn catalog() -> Value {
    json!({
        "version": "v1",
        "service": "memory-service",
        "tools": [
            {
                "name": "memory.append",
                "description": "Append a memory entry",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "maxLength": 10000},
                        "tags": {"type": "array", "items": {"type": "string"}}
                    },
                    "required": ["text"],
                    "additionalProperties": false
                },
                "output_schema": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "count": {"type": "integer"}},
                    "required": ["id", "count"],
                    "additionalProperties": false
                },
                "timeout_ms_default": 5000, "timeout_ms_max": 30000,
                "idempotent": false, "side_effects": true
            },
            {
                "name": "memory.query",
                "description": "Find memory entries containing a text; `delay_ms` makes the search slow on purpose",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                        "delay_ms": {"type": "integer", "minimum": 0, "maximum": 60000}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                },
                "output_schema": {
                    "type": "object",
                    "properties": {
                        "matches": {"type": "array", "items": {
                            "type": "object",
                            "properties": {"id": {"type": "string"}, "text": {"type": "string"}},
                            "required": ["id", "text"]
                        }}
                    },
                    "required": ["matches"],
                    "additionalProperties": false
                },
                "timeout_ms_default": 2000, "timeout_ms_max": 10000,
                "idempotent": true, "side_effects": false
            },
            {
                "name": "memory.delete",
                "description": "Delete a memory entry by id",
                "input_schema": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}},
                    "required": ["id"],
                    "additionalProperties": false
                },
                "output_schema": {
                    "type": "object",
                    "properties": {"deleted": {"type": "boolean"}},
                    "required": ["deleted"],
                    "additionalProperties": false
                },
                "timeout_ms_default": 2000, "timeout_ms_max": 5000,
                "idempotent": true, "side_effects": true
            }
        ]
    })
}

/// A way for the app to break its contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer `status: ok` with a result that breaks the tool's output schema.
    BadOutput,
    /// Answer this HTTP status with a non-JSON body.
    Status(u16),
    /// Answer 200 with a body that is not JSON.
    Garbage,
    /// Answer `status: retryable_error` (a dependency of the tool is down).
    Retryable,
}

/// How many received calls the app remembers (a long-running sample app must not grow).
pub const RECEIVED_KEPT: usize = 1024;

/// One `POST /v1/tools/call` the app received.
#[derive(Debug, Clone)]
pub struct Received {
    pub tool: String,
    pub body: Value,
    /// The body as it arrived.
    pub raw_body: Bytes,
    pub headers: http::HeaderMap,
}

#[derive(Debug, Default)]
struct Store {
    next: u64,
    entries: BTreeMap<String, String>,
}

/// State of a running memory app.
#[derive(Debug, Default)]
pub struct MemoryApp {
    store: Mutex<Store>,
    /// The last [`RECEIVED_KEPT`] calls, oldest first.
    received: Mutex<std::collections::VecDeque<Received>>,
    fault: Mutex<Option<Fault>>,
    /// Calls whose handling started and did not finish (the connection was dropped).
    abandoned: std::sync::atomic::AtomicUsize,
}

struct AbandonGuard<'a>(&'a MemoryApp, bool);
impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0
                .abandoned
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl MemoryApp {
    /// Calls received so far (the last [`RECEIVED_KEPT`]).
    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .expect("lock")
            .iter()
            .cloned()
            .collect()
    }

    /// Calls whose connection was dropped before the app answered.
    pub fn abandoned(&self) -> usize {
        self.abandoned.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Make the app misbehave (or behave again with `None`).
    pub fn set_fault(&self, fault: Option<Fault>) {
        *self.fault.lock().expect("lock") = fault;
    }

    /// Serve on a TCP `listener` until the task is aborted.
    pub fn serve(self: &Arc<Self>, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let app = self.clone();
        tokio::spawn(async move {
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    app.clone().serve_connection(stream);
                }
            }
        })
    }

    /// Serve on a Unix socket `listener` until the task is aborted.
    pub fn serve_unix(self: &Arc<Self>, listener: UnixListener) -> tokio::task::JoinHandle<()> {
        let app = self.clone();
        tokio::spawn(async move {
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    app.clone().serve_connection(stream);
                }
            }
        })
    }

    /// Serve one accepted connection.
    pub fn serve_connection<S>(self: Arc<Self>, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let app = self.clone();
                async move { Ok::<_, std::convert::Infallible>(app.handle(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        match (req.method().clone(), req.uri().path()) {
            (Method::GET, "/v1/tools") => reply(StatusCode::OK, &catalog()),
            (Method::POST, "/v1/tools/call") => {
                let headers = req.headers().clone();
                let raw_body = match req.into_body().collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(_) => return reply(StatusCode::BAD_REQUEST, &json!({})),
                };
                let Ok(body) = serde_json::from_slice::<Value>(&raw_body) else {
                    return reply(StatusCode::BAD_REQUEST, &json!({"error": "not json"}));
                };
                let tool = body["tool_name"].as_str().unwrap_or("").to_string();
                {
                    let mut received = self.received.lock().expect("lock");
                    if received.len() == RECEIVED_KEPT {
                        received.pop_front();
                    }
                    received.push_back(Received {
                        tool: tool.clone(),
                        body: body.clone(),
                        raw_body,
                        headers,
                    });
                }
                let mut guard = AbandonGuard(self, false);
                let resp = self.call(&tool, &body).await;
                guard.1 = true;
                resp
            }
            _ => reply(StatusCode::NOT_FOUND, &json!({"error": "not found"})),
        }
    }

    async fn call(&self, tool: &str, body: &Value) -> Response<Full<Bytes>> {
        let call_id = body["call_id"].clone();
        let args = &body["args"];
        let fault = self.fault.lock().expect("lock").clone();
        match fault {
            Some(Fault::Status(s)) => {
                let mut r = Response::new(Full::new(Bytes::from_static(b"upstream trouble")));
                *r.status_mut() = StatusCode::from_u16(s).unwrap_or(StatusCode::BAD_GATEWAY);
                return r;
            }
            Some(Fault::Garbage) => {
                return Response::new(Full::new(Bytes::from_static(b"<html>oops</html>")))
            }
            Some(Fault::Retryable) => {
                return reply(
                    StatusCode::OK,
                    &json!({"version": "v1", "call_id": call_id, "tool_name": tool,
                            "status": "retryable_error",
                            "error": {"code": "DEPENDENCY_UNAVAILABLE", "message": "store busy", "retryable": true},
                            "duration_ms": 1}),
                )
            }
            _ => {}
        }
        let result = self.run(tool, args).await;
        let result = match (result, fault) {
            (Ok(_), Some(Fault::BadOutput)) => {
                Ok(json!({"unexpected": "shape", "api_key": "leak"}))
            }
            (r, _) => r,
        };
        let body = match result {
            Ok(r) => json!({"version": "v1", "call_id": call_id, "tool_name": tool,
                             "status": "ok", "result": r, "duration_ms": 1}),
            Err((code, message)) => json!({"version": "v1", "call_id": call_id, "tool_name": tool,
                             "status": "error", "error": {"code": code, "message": message, "retryable": false},
                             "duration_ms": 1}),
        };
        reply(StatusCode::OK, &body)
    }

    /// Run `tool` on the store: its result, or its error's code and message.
    async fn run(&self, tool: &str, args: &Value) -> Result<Value, (&'static str, String)> {
        match tool {
            "memory.append" => {
                let mut s = self.store.lock().expect("lock");
                s.next += 1;
                let id = format!("m{}", s.next);
                s.entries
                    .insert(id.clone(), args["text"].as_str().unwrap_or("").to_string());
                Ok(json!({"id": id, "count": s.entries.len()}))
            }
            "memory.query" => {
                if let Some(ms) = args["delay_ms"].as_u64() {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                let q = args["query"].as_str().unwrap_or("");
                let limit = args["limit"].as_u64().unwrap_or(10) as usize;
                let s = self.store.lock().expect("lock");
                let matches: Vec<Value> = s
                    .entries
                    .iter()
                    .filter(|(_, t)| t.contains(q))
                    .take(limit)
                    .map(|(id, t)| json!({"id": id, "text": t}))
                    .collect();
                Ok(json!({"matches": matches}))
            }
            "memory.delete" => {
                let id = args["id"].as_str().unwrap_or("");
                let deleted = self
                    .store
                    .lock()
                    .expect("lock")
                    .entries
                    .remove(id)
                    .is_some();
                if deleted {
                    Ok(json!({"deleted": true}))
                } else {
                    Err(("NOT_FOUND", format!("no entry {id}")))
                }
            }
            other => Err(("TOOL_NOT_FOUND", format!("no tool {other}"))),
        }
    }
}

fn reply(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}
