//! 15: the caller-tool relay: a caller offers a tool over its stream, an agent calls it.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use super::{call, code, start};
use crate::client::{Client, Transport};
use crate::server::Running;

/// A caller's stream on the Unix socket, read event by event.
struct CallerStream {
    body: hyper::body::Incoming,
    buffered: String,
    _conn: tokio::task::JoinHandle<()>,
}

impl CallerStream {
    async fn open(socket: &Path, declaration: Value) -> Result<Self, String> {
        let io = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::post("/v1/caller-tools")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(declaration.to_string())))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        if resp.headers().get("content-type").map(|v| v.as_bytes()) != Some(b"text/event-stream") {
            return Err(format!("the stream was refused: HTTP {}", resp.status()));
        }
        Ok(CallerStream {
            body: resp.into_body(),
            buffered: String::new(),
            _conn: conn,
        })
    }

    /// The next event (keep-alives skipped), within 5 s.
    async fn next(&mut self) -> Result<Value, String> {
        loop {
            if let Some(end) = self.buffered.find("\n\n") {
                let block: String = self.buffered.drain(..end + 2).collect();
                if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return serde_json::from_str(data).map_err(|e| e.to_string());
                }
                continue;
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                .await
                .map_err(|_| "no event within 5 s".to_string())?
                .ok_or("the stream ended")?
                .map_err(|e| e.to_string())?;
            if let Ok(data) = frame.into_data() {
                self.buffered.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }
}

/// 15: a caller on the local socket offers `notify`; an agent calls `demo_notify` through the
/// tools-v1 front; the caller answers; then a caller that goes away mid-call.
pub(super) async fn relay_step(dir: &Path, app_addr: &str) -> Result<(), String> {
    let running = start_relay(dir, app_addr).await?;
    let socket = running.unix_path.clone().ok_or("no unix socket")?;
    let declaration = json!({"caller_id": "demo", "tools": [{"name": "notify",
        "description": "Show a notification to the user",
        "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}},
                        "required": ["message"]}}]});
    let mut caller = CallerStream::open(&socket, declaration.clone()).await?;
    let registered = caller.next().await?;
    let stream_id = registered["stream_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    let agent = Client::new(Transport::Unix(socket.clone()));
    let listed = agent
        .send(http::Method::GET, "/v1/tools", &[], "")
        .await?
        .json()["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "demo_notify"));
    if !listed {
        return Err("relay: demo_notify is not listed".into());
    }
    let notify = |message: &'static str| {
        let agent = agent.clone();
        tokio::spawn(async move {
            let body = call("demo_notify", json!({ "message": message }), None);
            agent.post_json("/v1/tools/call", &[], &body).await
        })
    };
    let pending = notify("tea is ready");
    let request = caller.next().await?;
    let answered = agent
        .post_json(
            "/v1/caller-tools/response",
            &[],
            &json!({"stream_id": stream_id, "request_id": request["request_id"],
                    "result": {"shown": true}}),
        )
        .await?;
    let result = pending.await.map_err(|e| e.to_string())??;
    if answered.json()["status"] != "ok" || result.json()["result"] != json!({"shown": true}) {
        return Err(format!(
            "relay: answered {}, the agent got {}",
            String::from_utf8_lossy(&answered.body),
            String::from_utf8_lossy(&result.body)
        ));
    }

    // A caller that goes away while a call waits for it.
    let pending = notify("anyone?");
    caller.next().await?;
    drop(caller);
    let gone = pending.await.map_err(|e| e.to_string())??;
    if code(&gone) != "DEPENDENCY_UNAVAILABLE" {
        return Err(format!(
            "relay: after the caller left the agent got {}",
            String::from_utf8_lossy(&gone.body)
        ));
    }
    println!(
        "15. caller tools  caller `demo` offers notify on its stream -> demo_notify listed; agent call emitted as {} (tool {}), answered -> result {}; caller gone mid-call -> {} at once",
        request["type"],
        request["tool"],
        result.json()["result"],
        code(&gone)
    );
    running.shutdown().await;
    Ok(())
}

/// A tools-v1 front on a Unix socket that relays calls to the tools its callers offer.
async fn start_relay(dir: &Path, app_addr: &str) -> Result<Running, String> {
    start(
        &dir.join("relay"),
        &format!(
            r#"
state_dir: {dir}/relay
front: {{ protocol: tools-v1 }}
listeners: {{ unix: {{ path: {dir}/relay/tools.sock }} }}
app: {{ protocol: tools-v1, address: "http://{app_addr}" }}
ops: {{ address: "" }}
caller_tools: {{ keepalive_s: 5 }}
"#,
            dir = dir.display()
        ),
    )
    .await
}
