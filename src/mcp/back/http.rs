//! Streamable HTTP towards an MCP server on loopback or a Unix socket: one `POST` per
//! message, the answer as JSON or as an SSE stream read to its end.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use carapace_filters::{BoxFuture, Rejection};

use super::upstream::{Answer, Outgoing, Reply, Transport};
use crate::upstream::{AppClient, AppResponse};

/// An MCP server reached over Streamable HTTP at `path`.
#[derive(Clone, Debug)]
pub struct HttpServer {
    client: AppClient,
    path: String,
    list_changed: std::sync::Arc<tokio::sync::Notify>,
}

impl HttpServer {
    pub fn new(
        client: AppClient,
        path: String,
        list_changed: std::sync::Arc<tokio::sync::Notify>,
    ) -> Self {
        HttpServer {
            client,
            path,
            list_changed,
        }
    }

    fn headers(msg: &Outgoing) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let Some(session) = &msg.session else {
            return h;
        };
        if let Ok(v) = HeaderValue::from_str(&session.version) {
            h.insert("mcp-protocol-version", v);
        }
        if let Some(id) = session
            .session
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            h.insert("mcp-session-id", id);
        }
        if session.modern {
            if let Ok(v) = HeaderValue::from_str(&msg.method) {
                h.insert("mcp-method", v);
            }
            if let Some(tool) = &msg.tool {
                h.insert("mcp-name", mirrored(tool));
            }
        }
        h
    }

    async fn post(&self, msg: &Outgoing, body: Value) -> Result<AppResponse, Rejection> {
        let body = Bytes::from(serde_json::to_vec(&body).expect("JSON values serialize"));
        self.client
            .send(Method::POST, &self.path, Self::headers(msg), body)
            .await
    }
}

/// A mirrored header value: as it is when it is visible ASCII, else `=?base64?…?=`.
pub(crate) fn mirrored(v: &str) -> HeaderValue {
    use base64::Engine;
    if v.bytes().all(|b| b.is_ascii_graphic() || b == b' ') && !v.starts_with(' ') {
        if let Ok(h) = HeaderValue::from_str(v) {
            return h;
        }
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(v.as_bytes());
    HeaderValue::from_str(&format!("=?base64?{b64}?=")).expect("base64 is a header value")
}

impl Transport for HttpServer {
    fn generation(&self) -> u64 {
        1
    }

    fn request(&self, msg: Outgoing) -> BoxFuture<Result<Answer, Rejection>> {
        let this = self.clone();
        Box::pin(async move {
            // The request's id is ours: one request per `POST`.
            let body =
                json!({"jsonrpc": "2.0", "id": 1, "method": msg.method, "params": msg.params});
            let resp = this.post(&msg, body).await?;
            if resp.status == StatusCode::NOT_FOUND
                && msg.session.as_ref().is_some_and(|s| s.session.is_some())
            {
                return Ok(Answer::SessionGone);
            }
            let session = resp
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let messages = messages(resp.status, &resp.headers, &resp.body)?;
            let mut reply = None;
            for m in messages {
                if m.get("method").is_some() {
                    this.server_message(&msg, m).await;
                } else if m.get("id") == Some(&json!(1)) {
                    reply = Reply::from_response(&m);
                }
            }
            match reply {
                Some(reply) => Ok(Answer::Reply { reply, session }),
                None if !resp.status.is_success() => Err(Rejection::AppHttp(resp.status.as_u16())),
                None => Err(Rejection::AppInvalid(format!(
                    "{} got no answer from the MCP server",
                    msg.method
                ))),
            }
        })
    }

    fn notify(&self, msg: Outgoing) -> BoxFuture<Result<(), Rejection>> {
        let this = self.clone();
        Box::pin(async move {
            let body = json!({"jsonrpc": "2.0", "method": msg.method, "params": msg.params});
            let resp = this.post(&msg, body).await?;
            if resp.status.is_success() {
                Ok(())
            } else {
                Err(Rejection::AppHttp(resp.status.as_u16()))
            }
        })
    }
}

impl HttpServer {
    /// A notification or request the server sent on a response stream.
    async fn server_message(&self, msg: &Outgoing, m: Value) {
        let method = m.get("method").and_then(Value::as_str).unwrap_or_default();
        let Some(id) = m.get("id") else {
            if method == "notifications/tools/list_changed" {
                self.list_changed.notify_one();
            }
            return;
        };
        let answer = match method {
            "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            _ => json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32601,
                "message": format!("carapace does not relay `{method}` to its callers"),
            }}),
        };
        if let Err(e) = self.post(msg, answer).await {
            tracing::debug!("answer to the server's `{method}` not delivered: {e}");
        }
    }
}

/// The JSON-RPC messages of an answer: one JSON document, or the `data` of each SSE event.
pub fn messages(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<Value>, Rejection> {
    let sse = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !sse {
        if body.is_empty() {
            return Ok(Vec::new());
        }
        return match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => Ok(items),
            Ok(v) => Ok(vec![v]),
            Err(_) if !status.is_success() => Ok(Vec::new()),
            Err(e) => Err(Rejection::AppInvalid(format!(
                "the MCP server's answer is not JSON: {e}"
            ))),
        };
    }
    Ok(sse_events(body)
        .into_iter()
        .filter_map(|data| serde_json::from_str::<Value>(&data).ok())
        .collect())
}

/// The `data` of each event of an SSE stream (multi-line data joined with `\n`).
pub fn sse_events(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    for line in text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
        if line.is_empty() {
            events.extend(data.take());
            continue;
        }
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_owned()),
            }
        }
    }
    events.extend(data);
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_join_data_lines_and_skip_comments_and_other_fields() {
        let body = b": keep-alive\r\nevent: message\r\nid: 7\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\ndata:{\"b\":2}\n\ndata: last";
        assert_eq!(sse_events(body), vec!["{\"a\":\n1}", "{\"b\":2}", "last"]);
    }

    #[test]
    fn a_tool_name_that_is_not_plain_ascii_is_mirrored_in_base64() {
        assert_eq!(mirrored("memory.append"), "memory.append");
        let v = mirrored("café");
        assert_eq!(
            crate::mcp::decode_header_value(v.to_str().unwrap()).as_deref(),
            Some("café")
        );
    }
}
