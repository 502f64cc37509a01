//! `carapace mcp-stdio`: a stdio MCP server bridging to the outbound socket's MCP endpoint, so
//! an agent that only knows how to start a command reaches every paired tool host.
//!
//! Each message read from stdin (one JSON-RPC message per line) is `POST`ed to the socket with
//! the headers its era needs: for 2026-07-28 the mirrored `MCP-Protocol-Version`, `Mcp-Method`
//! and `Mcp-Name`; for the handshake era the `Mcp-Session-Id` and version the `initialize`
//! answer gave. Answers go to stdout, one per line, in the order they complete. A
//! `notifications/cancelled` also drops the named request's connection, which cancels it
//! upstream in both eras. At the end of stdin the calls in flight finish, the session is ended
//! (`DELETE`) and the bridge exits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use http::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex as AsyncMutex;
use tokio::task::JoinSet;

use crate::client::{Client, Transport};
use crate::mcp::back::lines::{Line, LineReader};

/// Longest message read from stdin.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// What the bridge knows of the handshake-era session.
#[derive(Default)]
struct Session {
    id: Option<String>,
    version: Option<String>,
}

struct Bridge<W> {
    client: Client,
    path: String,
    out: AsyncMutex<W>,
    session: Mutex<Session>,
    in_flight: Mutex<HashMap<String, tokio::task::AbortHandle>>,
}

/// Bridge `input` and `output` to the MCP endpoint at `path` on the Unix socket `socket`.
pub async fn run<R, W>(socket: PathBuf, path: &str, input: R, output: W) -> std::io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let bridge = Arc::new(Bridge {
        client: Client::new(Transport::Unix(socket)),
        path: path.to_owned(),
        out: AsyncMutex::new(output),
        session: Mutex::default(),
        in_flight: Mutex::default(),
    });
    let mut lines = LineReader::new(input, MAX_MESSAGE_BYTES);
    let mut tasks = JoinSet::new();
    while let Some(line) = lines.next_line().await? {
        let msg = match line {
            Line::Text(l) if l.iter().all(u8::is_ascii_whitespace) => continue,
            Line::Text(l) => match serde_json::from_slice::<Value>(&l) {
                Ok(v) => v,
                Err(e) => {
                    let e = json!({"jsonrpc": "2.0", "id": null,
                        "error": {"code": -32700, "message": format!("Parse error: {e}")}});
                    bridge.write(&e).await?;
                    continue;
                }
            },
            Line::TooLong(n) => {
                let e = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600,
                    "message": format!("a message of {n} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")}});
                bridge.write(&e).await?;
                continue;
            }
        };
        bridge.cancel_named(&msg);
        let key = msg
            .get("id")
            .filter(|_| msg.get("method").is_some())
            .map(Value::to_string);
        let b = bridge.clone();
        let handle = tasks.spawn(async move { b.forward(msg).await });
        if let Some(key) = key {
            bridge.in_flight.lock().expect("lock").insert(key, handle);
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    bridge.end_session().await;
    Ok(())
}

impl<W: AsyncWrite + Unpin> Bridge<W> {
    async fn write(&self, msg: &Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(msg).expect("JSON values serialize");
        line.push(b'\n');
        let mut out = self.out.lock().await;
        out.write_all(&line).await?;
        out.flush().await
    }

    /// A `notifications/cancelled` drops the named request's connection (it is also sent on,
    /// for a handshake-era session).
    fn cancel_named(&self, msg: &Value) {
        if msg.get("method").and_then(Value::as_str) != Some("notifications/cancelled") {
            return;
        }
        if let Some(id) = msg.pointer("/params/requestId") {
            if let Some(h) = self.in_flight.lock().expect("lock").remove(&id.to_string()) {
                h.abort();
            }
        }
    }

    /// The headers `msg` needs in its era.
    fn headers(&self, msg: &Value) -> Vec<(String, String)> {
        let method = msg.get("method").and_then(Value::as_str);
        let modern = msg.pointer(&format!(
            "/params/_meta/{}",
            META_VERSION.replace('/', "~1")
        ));
        let mut h = Vec::new();
        if let (Some(version), Some(method)) = (modern.and_then(Value::as_str), method) {
            h.push(("mcp-protocol-version".into(), version.to_owned()));
            h.push(("mcp-method".into(), method.to_owned()));
            if method == "tools/call" {
                if let Some(name) = msg.pointer("/params/name").and_then(Value::as_str) {
                    let v = crate::mcp::back::http::mirrored(name);
                    h.push(("mcp-name".into(), v.to_str().unwrap_or_default().to_owned()));
                }
            }
            return h;
        }
        let s = self.session.lock().expect("lock");
        if let Some(id) = &s.id {
            h.push(("mcp-session-id".into(), id.clone()));
        }
        if let Some(v) = &s.version {
            h.push(("mcp-protocol-version".into(), v.clone()));
        }
        h
    }

    /// `POST` one message and write its answer, if it has one.
    async fn forward(&self, msg: Value) -> std::io::Result<()> {
        let headers = self.headers(&msg);
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let is_initialize = msg.get("method").and_then(Value::as_str) == Some("initialize");
        let expects_answer =
            msg.get("method").is_some() && msg.get("id").is_some() || msg.is_array();
        let reply = self
            .client
            .send(Method::POST, &self.path, &h, msg.to_string())
            .await;
        self.in_flight.lock().expect("lock").remove(&id.to_string());
        let reply = match reply {
            Ok(r) => r,
            Err(e) if expects_answer => {
                let e = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603,
                    "message": format!("the outbound socket cannot be reached: {e}")}});
                return self.write(&e).await;
            }
            Err(_) => return Ok(()),
        };
        if reply.body.is_empty() {
            return Ok(());
        }
        let answer = match serde_json::from_slice::<Value>(&reply.body) {
            Ok(v) => v,
            Err(_) if !expects_answer => return Ok(()),
            Err(_) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603,
                "message": format!("carapace answered HTTP {}", reply.status.as_u16())}}),
        };
        if is_initialize {
            let mut s = self.session.lock().expect("lock");
            s.id = reply
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            s.version = answer
                .pointer("/result/protocolVersion")
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        self.write(&answer).await
    }

    async fn end_session(&self) {
        let id = self.session.lock().expect("lock").id.take();
        if let Some(id) = id {
            let _ = self
                .client
                .send(
                    Method::DELETE,
                    &self.path,
                    &[("mcp-session-id", id.as_str())],
                    "",
                )
                .await;
        }
    }
}
