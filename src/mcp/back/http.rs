//! Streamable HTTP towards an MCP server on loopback or a Unix socket: one `POST` per
//! message, the answer as JSON or as an SSE stream read as it arrives, so the server's
//! notifications and requests about a call reach the caller's stream while the call runs (and
//! the answers to its requests are posted back to it).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use carapace_filters::{BoxFuture, Rejection};

use super::upstream::{Answer, Negotiated, Notices, Outgoing, Reply, Transport};
use crate::upstream::{AppClient, AppResponse, OpenResponse};
use http_body_util::BodyExt;

/// An MCP server reached over Streamable HTTP at `path`.
#[derive(Clone, Debug)]
pub struct HttpServer {
    client: AppClient,
    path: String,
    notices: Notices,
}

impl HttpServer {
    pub fn new(client: AppClient, path: String, notices: Notices) -> Self {
        HttpServer {
            client,
            path,
            notices,
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

    async fn open(&self, msg: &Outgoing, body: Value) -> Result<OpenResponse, Rejection> {
        let body = Bytes::from(serde_json::to_vec(&body).expect("JSON values serialize"));
        self.client
            .open(Method::POST, &self.path, Self::headers(msg), body)
            .await
    }

    /// Read an SSE answer as it arrives, acting on the server's messages, up to the answer.
    async fn read_stream(
        &self,
        msg: &Outgoing,
        mut body: http_body_util::Limited<crate::upstream::AppBody>,
    ) -> Result<Option<Reply>, Rejection> {
        let mut parser = SseParser::default();
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| Rejection::AppInvalid(format!("reading the answer: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for event in parser.push(&data) {
                if let Some(reply) = self.event(msg, &event).await {
                    return Ok(Some(reply));
                }
            }
        }
        match parser.finish() {
            Some(event) => Ok(self.event(msg, &event).await),
            None => Ok(None),
        }
    }

    /// One event of an answer stream: the answer, or a message of the server acted on.
    async fn event(&self, msg: &Outgoing, data: &str) -> Option<Reply> {
        let m = serde_json::from_str::<Value>(data).ok()?;
        if m.get("method").is_some() {
            self.server_message(msg, m).await;
            return None;
        }
        if m.get("id") == Some(&json!(1)) {
            return Reply::from_response(&m);
        }
        None
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

    fn sessions_alongside(&self) -> bool {
        true
    }

    fn events(&self, session: Arc<Negotiated>) -> BoxFuture<Result<(), Rejection>> {
        let this = self.clone();
        Box::pin(async move {
            let msg = Outgoing {
                method: String::new(),
                params: Value::Null,
                tool: None,
                session: Some(session),
                relay: None,
            };
            let mut headers = Self::headers(&msg);
            headers.remove(http::header::CONTENT_TYPE);
            headers.insert(
                http::header::ACCEPT,
                HeaderValue::from_static("text/event-stream"),
            );
            let resp = this
                .client
                .open(Method::GET, &this.path, headers, Bytes::new())
                .await?;
            if !resp.status.is_success() || !is_sse(&resp.headers) {
                return Err(Rejection::AppHttp(resp.status.as_u16()));
            }
            this.read_stream(&msg, resp.body).await.map(|_| ())
        })
    }

    fn request(&self, msg: Outgoing) -> BoxFuture<Result<Answer, Rejection>> {
        let this = self.clone();
        Box::pin(async move {
            // The request's id is ours: one request per `POST`.
            let body =
                json!({"jsonrpc": "2.0", "id": 1, "method": msg.method, "params": msg.params});
            let resp = this.open(&msg, body).await?;
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
            let status = resp.status;
            let reply = if is_sse(&resp.headers) {
                this.read_stream(&msg, resp.body).await?
            } else {
                let body = resp
                    .body
                    .collect()
                    .await
                    .map_err(|e| Rejection::AppInvalid(format!("reading the answer: {e}")))?
                    .to_bytes();
                let mut reply = None;
                for m in messages(status, &resp.headers, &body)? {
                    if m.get("method").is_some() {
                        this.server_message(&msg, m).await;
                    } else if m.get("id") == Some(&json!(1)) {
                        reply = Reply::from_response(&m);
                    }
                }
                reply
            };
            match reply {
                Some(reply) => Ok(Answer::Reply { reply, session }),
                None if !status.is_success() => Err(Rejection::AppHttp(status.as_u16())),
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
        let params = m.get("params").cloned().unwrap_or(Value::Null);
        let Some(id) = m.get("id") else {
            if !self.notices.take(method, &params) {
                if let Some(relay) = &msg.relay {
                    relay.notify(method, params);
                }
            }
            return;
        };
        let reply = match (method, &msg.relay) {
            ("ping", _) => Reply::Result(json!({})),
            (_, Some(relay)) if relay.answers(method) => relay.ask(method, params).await,
            _ => Reply::Error {
                code: -32601,
                message: format!("the caller of carapace cannot answer `{method}`"),
                data: None,
            },
        };
        let answer = reply.into_response(id.clone());
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
    if !is_sse(headers) {
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
    let mut parser = SseParser::default();
    let mut events = parser.push(body);
    events.extend(parser.finish());
    events
}

fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Splits an SSE stream into the `data` of its events as its bytes arrive. A line is held
/// until its end arrives, so it is bounded by what the body may hold in all.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// The events `bytes` complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&rest[..end]);
            rest = &rest[end + 1..];
            let line = std::mem::take(&mut self.line);
            self.line_ended(&line, &mut events);
        }
        self.line.extend_from_slice(rest);
        events
    }

    /// The last event, when the stream ends without a blank line.
    pub fn finish(mut self) -> Option<String> {
        let line = std::mem::take(&mut self.line);
        let mut events = Vec::new();
        if !line.is_empty() {
            self.line_ended(&line, &mut events);
        }
        events.into_iter().next().or(self.data)
    }

    fn line_ended(&mut self, line: &[u8], events: &mut Vec<String>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            events.extend(self.data.take());
            return;
        }
        let Some(rest) = line.strip_prefix(b"data:") else {
            return;
        };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        let rest = String::from_utf8_lossy(rest);
        match &mut self.data {
            Some(d) => {
                d.push('\n');
                d.push_str(&rest);
            }
            None => self.data = Some(rest.into_owned()),
        }
    }
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
    fn events_split_across_reads_come_out_whole_and_in_order() {
        let body = b"data: {\"a\":1}\r\n\r\nevent: message\ndata: {\"b\":\n\ndata: x";
        for cut in 0..body.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&body[..cut]);
            got.extend(p.push(&body[cut..]));
            got.extend(p.finish());
            assert_eq!(got, vec!["{\"a\":1}", "{\"b\":", "x"], "cut at {cut}");
        }
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
