//! The relay's routes, on every front's listener and the Unix socket, after identity:
//!
//! - `POST /v1/caller-tools` `{"caller_id"?, "tools": [{name, description, inputSchema}]}`
//!   declares the caller's tools and answers with the caller's stream (`text/event-stream`):
//!   first `caller_tools_registered` (with the `stream_id` answers must name), then a
//!   `caller_tool_request` per call, and keep-alive comments. On mTLS the caller id is the
//!   peer's `component_id` (a different `caller_id` in the body is refused); on the Unix
//!   socket the body names it.
//! - `POST /v1/caller-tools/response` `{"stream_id", "request_id", "result" | "error"}`
//!   answers one request; only the principal holding that stream may (on the MCP front, the
//!   method `caller_tool_response` with the same params).
//! - `POST /v1/caller-tool` `{"method": "caller_tool", "params": {"tool", "arguments"}}`, on
//!   the local Unix socket only: the relay text's socket form for an agent in the container.
//!   The call passes the whole call stage and is answered `{"result": …}` or
//!   `{"error": {"code", "message"}}` when the caller has answered.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body::Frame;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower::Service;

use carapace_filters::call::{CallOutcome, Credential, Principal, ToolCall};
use carapace_filters::{BoxFuture, Rejection};

use super::registry::{Answer, CallerTools, Declared, Event, StreamGuard};
use crate::caller_body::CallerBody;
use crate::catalog::CatalogHandle;
use crate::front::{json_response, CallStack, Resp};

/// Where a caller opens its stream.
pub const STREAM_PATH: &str = "/v1/caller-tools";
/// Where a caller answers a request.
pub const RESPONSE_PATH: &str = "/v1/caller-tools/response";
/// The MCP method a caller answers a request with, on the MCP front.
pub const MCP_METHOD: &str = "caller_tool_response";
/// Where an agent on the local socket calls a tool in the relay text's socket form.
pub const SOCKET_CALL_PATH: &str = "/v1/caller-tool";

/// Take `body` (`{stream_id, request_id, result | error}`) as `principal`'s answer.
pub fn answer(relay: &CallerTools, principal: &str, mut body: Value) -> Result<(), Rejection> {
    // An MCP request's own metadata is not part of the answer.
    if let Some(m) = body.as_object_mut() {
        m.remove("_meta");
    }
    let r: Response = serde_json::from_value(body).map_err(|e| Rejection::InvalidRequest {
        message: e.to_string(),
        path: None,
    })?;
    let answer = r.answer()?;
    relay
        .respond(principal, &r.stream_id, &r.request_id, answer)
        .map_err(|e| e.rejection())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Declaration {
    #[serde(default)]
    caller_id: Option<String>,
    tools: Vec<Declared>,
}

/// An answer to one request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub stream_id: String,
    pub request_id: String,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<Value>,
}

impl Response {
    /// The answer it carries: exactly one of `result` and `error` (a string, or an object
    /// with a `message`).
    pub fn answer(&self) -> Result<Answer, Rejection> {
        let invalid = |m: &str| Rejection::InvalidRequest {
            message: m.into(),
            path: None,
        };
        match (&self.result, &self.error) {
            (Some(r), None | Some(Value::Null)) if !r.is_null() => Ok(Answer::Result(r.clone())),
            (None | Some(Value::Null), Some(Value::String(m))) => Ok(Answer::Error(m.clone())),
            (None | Some(Value::Null), Some(e @ Value::Object(_))) => Ok(Answer::Error(
                e.get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| e.to_string(), str::to_owned),
            )),
            _ => Err(invalid("give exactly one of result and error")),
        }
    }
}

/// Adds [`RelayRoutes`] to a stack.
#[derive(Clone)]
pub struct RelayLayer {
    relay: Arc<CallerTools>,
    max_body_bytes: usize,
    /// Longest wait for a body (`limits.body_timeout_ms`): the relay's routes sit before the
    /// body-limit layer.
    body_timeout: Duration,
    /// The call stage and the catalog, for the socket form.
    calls: CallStack,
    catalog: Arc<CatalogHandle>,
}

impl RelayLayer {
    pub fn new(
        relay: Arc<CallerTools>,
        body: carapace_filters::body::BodyLimits,
        calls: CallStack,
        catalog: Arc<CatalogHandle>,
    ) -> Self {
        RelayLayer {
            relay,
            max_body_bytes: body.max_bytes as usize,
            body_timeout: body.deadline,
            calls,
            catalog,
        }
    }
}

impl<S> tower::Layer<S> for RelayLayer {
    type Service = RelayRoutes<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RelayRoutes {
            inner,
            layer: self.clone(),
        }
    }
}

/// Serves the relay's routes; everything else goes on to `inner`.
#[derive(Clone)]
pub struct RelayRoutes<S> {
    inner: S,
    layer: RelayLayer,
}

impl<S> Service<Request<CallerBody>> for RelayRoutes<S>
where
    S: Service<Request<CallerBody>, Response = Resp, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Resp;
    type Error = Rejection;
    type Future = BoxFuture<Result<Resp, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<CallerBody>) -> Self::Future {
        let path = req.uri().path();
        if path != STREAM_PATH && path != RESPONSE_PATH && path != SOCKET_CALL_PATH {
            let clone = self.inner.clone();
            let mut inner = std::mem::replace(&mut self.inner, clone);
            return Box::pin(async move { inner.call(req).await });
        }
        let layer = self.layer.clone();
        Box::pin(async move { layer.serve(req).await })
    }
}

impl RelayLayer {
    async fn serve(self, req: Request<CallerBody>) -> Result<Resp, Rejection> {
        if req.method() != Method::POST {
            return Err(Rejection::MethodNotAllowed(format!(
                "{} {}: only POST",
                req.method(),
                req.uri().path()
            )));
        }
        let principal = crate::front::principal(&req)?;
        // On a front whose callers are known by a signature over each request (skill-v1, RFC
        // 9421), a connection without a certificate is `anonymous` until a call's signature is
        // checked, which these routes never reach: every such caller would be one principal,
        // able to register tools under it and take over another's registration.
        if principal.kind == "anonymous" {
            return Err(Rejection::AuthFailed(
                "the caller-tool routes need a client certificate, a bearer token or the local socket",
            ));
        }
        let path = req.uri().path().to_owned();
        let body = tokio::time::timeout(
            self.body_timeout,
            read_json(req.into_body(), self.max_body_bytes),
        )
        .await
        .map_err(|_| Rejection::BodyTimeout(self.body_timeout))??;
        if path == STREAM_PATH {
            self.open(&principal, body)
        } else if path == SOCKET_CALL_PATH {
            self.socket_call(principal, body).await
        } else {
            let r: Response =
                serde_json::from_value(body).map_err(|e| Rejection::InvalidRequest {
                    message: e.to_string(),
                    path: None,
                })?;
            let answer = r.answer()?;
            self.relay
                .respond(&principal.id, &r.stream_id, &r.request_id, answer)
                .map_err(|e| e.rejection())?;
            Ok(json_response(
                http::StatusCode::OK,
                &json!({"status": "ok"}),
            ))
        }
    }

    fn open(&self, principal: &Principal, body: Value) -> Result<Resp, Rejection> {
        let d: Declaration =
            serde_json::from_value(body).map_err(|e| Rejection::InvalidRequest {
                message: e.to_string(),
                path: None,
            })?;
        let local = principal.kind == "local";
        let caller_id = match (local, d.caller_id) {
            (true, Some(id)) => id,
            (true, None) => {
                return Err(Rejection::InvalidRequest {
                    message: "caller_id is required on the local socket".into(),
                    path: Some("/caller_id".into()),
                })
            }
            (false, Some(id)) if *id != *principal.id => {
                return Err(Rejection::Forbidden(format!(
                    "{} may register tools only as {}",
                    principal.id, principal.id
                )))
            }
            (false, _) => principal.id.to_string(),
        };
        let (events, guard) = self
            .relay
            .register(&principal.id, &caller_id, d.tools)
            .map_err(|e| e.rejection())?;
        let keepalive = Duration::from_secs(self.relay.config().keepalive_s);
        let body = EventStream {
            events,
            keepalive: tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive),
            _guard: guard,
        };
        Ok(crate::mcp::stream::sse_response(body.boxed_unsync()))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SocketCall {
    method: String,
    params: SocketParams,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SocketParams {
    tool: String,
    #[serde(default)]
    arguments: Option<Value>,
}

impl RelayLayer {
    /// The socket form: `{"method": "caller_tool", "params": {"tool", "arguments"}}`, from
    /// the local socket only, through the call stage.
    async fn socket_call(&self, principal: Arc<Principal>, body: Value) -> Result<Resp, Rejection> {
        if principal.kind != "local" {
            return Err(Rejection::Forbidden(
                "the caller_tool socket form is for the local socket".into(),
            ));
        }
        let c: SocketCall =
            serde_json::from_value(body).map_err(|e| Rejection::InvalidRequest {
                message: e.to_string(),
                path: None,
            })?;
        if c.method != "caller_tool" {
            return Err(Rejection::InvalidRequest {
                message: format!("method `{}`: only caller_tool", c.method),
                path: Some("/method".into()),
            });
        }
        let tool = self.catalog.lookup(&c.params.tool)?;
        let call = ToolCall {
            call_id: format!("ctr-{}", hex::encode(rand::random::<[u8; 8]>())).into(),
            tool,
            tenant_id: None,
            args: c.params.arguments.unwrap_or_else(|| json!({})),
            context: None,
            timeout_ms: None,
            idempotency_key: None,
            principal,
            request_id: None,
            trace_context: Vec::new(),
            extensions: Default::default(),
            credential: Credential::None,
        };
        let answer = match self.calls.start(call).await {
            Ok(CallOutcome::Ok { output, .. }) => json!({"result": output}),
            Ok(CallOutcome::AppError { code, message, .. }) => {
                json!({"error": {"code": code, "message": message}})
            }
            Err(r) => {
                let (code, _) = crate::errors::tools_v1(&r);
                json!({"error": {"code": code, "message": crate::errors::message(&r)}})
            }
        };
        Ok(json_response(http::StatusCode::OK, &answer))
    }
}

/// Read a JSON body of at most `max` bytes.
async fn read_json(body: CallerBody, max: usize) -> Result<Value, Rejection> {
    let bytes = http_body_util::Limited::new(body, max)
        .collect()
        .await
        .map_err(|_| Rejection::PayloadTooLarge { limit: max as u64 })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| Rejection::InvalidRequest {
        message: format!("body is not JSON: {e}"),
        path: None,
    })
}

/// A caller's stream: its events as SSE `data` lines, and a comment line every keep-alive
/// period. Dropping it (the caller went away) ends the registration.
struct EventStream {
    events: mpsc::Receiver<Event>,
    keepalive: tokio::time::Interval,
    _guard: StreamGuard,
}

impl http_body::Body for EventStream {
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(event) = self.events.poll_recv(cx) {
            return Poll::Ready(event.map(|e| {
                let mut line = b"data: ".to_vec();
                line.extend_from_slice(e.to_json().to_string().as_bytes());
                line.extend_from_slice(b"\n\n");
                Ok(Frame::data(Bytes::from(line)))
            }));
        }
        match self.keepalive.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                b": keep-alive\n\n",
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CallerToolsConfig;

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_carries_keep_alive_comments_and_ending_it_withdraws_the_tools() {
        let catalog = Arc::new(CatalogHandle::default());
        let relay = CallerTools::new(CallerToolsConfig::default(), catalog.clone());
        let declared = Declared {
            name: "t".into(),
            description: String::new(),
            input_schema: None,
        };
        let (events, guard) = relay.register("local", "c", vec![declared]).unwrap();
        let period = Duration::from_secs(15);
        let mut stream = EventStream {
            events,
            keepalive: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
            _guard: guard,
        };
        let first = stream.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(first.starts_with(b"data: {"), "{first:?}");
        let started = tokio::time::Instant::now();
        let second = stream.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&second[..], b": keep-alive\n\n");
        assert_eq!(started.elapsed(), period);
        assert!(catalog.load().get("c_t").is_some());
        drop(stream);
        assert!(catalog.load().get("c_t").is_none());
    }
}
