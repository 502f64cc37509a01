//! The MCP front: one endpoint (`front.mcp.path`, default `/mcp`) taking JSON-RPC over
//! `POST`, in the era each request asks for (see the [module docs](super)).

mod call;
mod era;
mod server;
use era::{declares_modern, session_error, Declared, Era};
mod subscribe;

use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use futures_util::future::{Either, FutureExt};
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Map, Value};
use tower::Service;

use carapace_filters::call::Principal;
use carapace_filters::secret_guard::SecretGuard;
use carapace_filters::signature::UnixClock;
use carapace_filters::{BoxFuture, Rejection};

use super::back::relay::ClientFeatures;
use super::back::McpUpstream;
use super::jsonrpc::{self, error_response, result_response, McpError, Message};
use super::passthrough;
use super::results::tool_definition;
use super::session::Sessions;
use super::wire::{self, CallParams};
use super::{LEGACY_VERSIONS, MODERN_VERSION, SESSION_HEADER, SUPPORTED_VERSIONS};
use crate::catalog::CatalogHandle;
use crate::config::mcp::McpFrontConfig;
use crate::edge::request_id::RequestId;
use crate::front::{self, CallStack, Resp};
use crate::in_flight::InFlightCalls;

const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// Most messages in one (2025-03-26) batch.
const MAX_BATCH: usize = 32;

/// The MCP front service; see the module docs. A copy of it is one reference count (a
/// `tools/call` takes none; the other messages' futures hold one).
#[derive(Clone)]
pub struct McpFront(Arc<FrontParts>);

/// What the MCP front holds.
#[derive(Clone)]
pub struct FrontParts {
    catalog: Arc<CatalogHandle>,
    /// Shared by every copy of the front.
    calls: Arc<CallStack>,
    /// The call stage without the per-tool rate limit, for calls that took their cell in
    /// [`super::early`].
    header_checked: Arc<CallStack>,
    clock: UnixClock,
    cfg: Arc<McpFrontConfig>,
    sessions: Arc<Sessions>,
    in_flight: Arc<InFlightCalls>,
    /// The MCP server behind carapace, when the app is one: its resources, prompts and
    /// completions are passed through.
    server: Option<Arc<McpUpstream>>,
    /// The tool-host side's secret guard, for what is passed through.
    guard: Option<Arc<SecretGuard>>,
    /// The caller-tool relay, answered with `caller_tool_response`.
    relay: Option<Arc<crate::relay::CallerTools>>,
    /// Whether the call stage signs receipts (a streamed answer then carries them as
    /// trailers).
    receipts: bool,
}

impl std::ops::Deref for McpFront {
    type Target = FrontParts;
    fn deref(&self) -> &FrontParts {
        &self.0
    }
}

impl McpFront {
    /// The parts, to configure (a copy if the front was cloned already).
    fn parts_mut(&mut self) -> &mut FrontParts {
        Arc::make_mut(&mut self.0)
    }

    /// Pass resources, prompts and completions through to `server`.
    pub fn with_server(mut self, server: Option<Arc<McpUpstream>>) -> Self {
        self.parts_mut().server = server;
        self
    }

    /// Guard what is passed through from the server (resources, prompts, completions) as
    /// tool results are.
    pub fn with_secret_guard(mut self, guard: Option<Arc<SecretGuard>>) -> Self {
        self.parts_mut().guard = guard;
        self
    }

    /// Say that the call stage signs receipts: a streamed answer then announces and sends
    /// them as trailers.
    pub fn with_receipts(mut self, receipts: bool) -> Self {
        self.parts_mut().receipts = receipts;
        self
    }

    /// Take callers' answers to relayed calls (`caller_tool_response`).
    pub fn with_relay(mut self, relay: Option<Arc<crate::relay::CallerTools>>) -> Self {
        self.parts_mut().relay = relay;
        self
    }

    pub fn new(
        catalog: Arc<CatalogHandle>,
        calls: CallStack,
        header_checked: CallStack,
        clock: UnixClock,
        cfg: Arc<McpFrontConfig>,
        sessions: Arc<Sessions>,
        in_flight: Arc<InFlightCalls>,
    ) -> Self {
        McpFront(Arc::new(FrontParts {
            catalog,
            calls: Arc::new(calls),
            header_checked: Arc::new(header_checked),
            clock,
            cfg,
            sessions,
            in_flight,
            server: None,
            guard: None,
            relay: None,
            receipts: false,
        }))
    }

    /// A request's answer. A call is decoded and handed to the call stage here, before the
    /// returned future is first polled: the future holds only what the answer needs (the
    /// stage's future, the id and the version), in one box (a streamed answer adds its own).
    fn handle(&self, req: Request<Bytes>) -> Result<Answer, Rejection> {
        if req.uri().path() != self.cfg.path {
            return Err(Rejection::NoRoute(req.uri().path().to_string()));
        }
        if let Some(origin) = req.headers().get(http::header::ORIGIN) {
            if !self
                .cfg
                .allowed_origins
                .iter()
                .any(|o| o.as_bytes() == origin.as_bytes())
            {
                let e = McpError::Origin(String::from_utf8_lossy(origin.as_bytes()).into());
                return Ok(answered(refused(None, &e)));
            }
        }
        let principal = front::principal(&req)?;
        match *req.method() {
            Method::POST => {}
            Method::DELETE => return Ok(answered(self.end_session(&req, &principal))),
            Method::GET if self.server.is_some() => {
                let this = self.clone();
                return Ok(Box::pin(async move { this.events(&req, &principal).await }));
            }
            _ => {
                let e = McpError::HttpMethod("POST, DELETE");
                return Ok(answered(refused(None, &e)));
            }
        }
        if req.body().trim_ascii_start().starts_with(b"[") {
            let this = self.clone();
            return Ok(Box::pin(async move { this.batch(&req, &principal).await }));
        }
        Ok(self.message(req, principal))
    }

    /// A JSON-RPC batch: only the 2025-03-26 revision has them (its clients may send them,
    /// and its servers must take them); every other revision refuses them.
    async fn batch(&self, req: &Request<Bytes>, principal: &Arc<Principal>) -> Resp {
        let items = match serde_json::from_slice::<Value>(req.body()) {
            Ok(Value::Array(items)) => items,
            Ok(_) => unreachable!("starts with `[`"),
            Err(e) => return refused(None, &McpError::Parse(e.to_string())),
        };
        if items.is_empty() {
            return refused(None, &McpError::InvalidRequest("the batch is empty".into()));
        }
        match self.session_of(req, principal) {
            Ok(Some(s)) if s.version == LEGACY_VERSIONS[2] => {}
            Err(e) => return refused(None, &e),
            Ok(_) => {
                let why = format!(
                    "batches are accepted only in a {} session",
                    LEGACY_VERSIONS[2]
                );
                return refused(None, &McpError::InvalidRequest(why));
            }
        }
        if items.len() > MAX_BATCH {
            let why = format!("a batch holds at most {MAX_BATCH} messages");
            return refused(None, &McpError::InvalidRequest(why));
        }
        let mut answers = Vec::new();
        for item in items {
            let mut one = Request::new(Bytes::from(serde_json::to_vec(&item).expect("a value")));
            *one.uri_mut() = req.uri().clone();
            *one.headers_mut() = req.headers().clone();
            // Each answer goes into the batch's array: a call is answered as JSON, never turned
            // into a stream of its server's messages (the array could not hold one).
            one.headers_mut().insert(
                http::header::ACCEPT,
                HeaderValue::from_static("application/json"),
            );
            if let Some(id) = req.extensions().get::<RequestId>() {
                one.extensions_mut().insert(id.clone());
            }
            let resp = self.message(one, principal.clone()).await;
            if resp.status() == StatusCode::ACCEPTED {
                continue;
            }
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            answers.push(serde_json::from_slice(&body.unwrap_or_default()).unwrap_or(Value::Null));
        }
        if answers.is_empty() {
            return accepted();
        }
        front::json_response(StatusCode::OK, &Value::Array(answers))
    }

    /// One JSON-RPC message; a `tools/call` is started here.
    fn message(&self, mut req: Request<Bytes>, principal: Arc<Principal>) -> Answer {
        let (id, params) = match wire::read_tools_call(req.body()) {
            Some(call) => (call.id, call.params),
            None => match jsonrpc::decode(req.body()) {
                Ok(Message::Request { id, method, params }) if method == "tools/call" => {
                    (id, CallParams::from_map(params))
                }
                decoded => {
                    let this = self.clone();
                    return Box::pin(
                        async move { this.other_message(&req, principal, decoded).await },
                    );
                }
            },
        };
        let era = match self.era(&req, "tools/call", &Declared::of_call(&params), &principal) {
            Ok(era) => era,
            Err(e) => return answered(refused(Some(&id), &e)),
        };
        self.tools_call(&mut req, id, params, principal, era)
    }

    /// Every message but a `tools/call` request.
    async fn other_message(
        &self,
        req: &Request<Bytes>,
        principal: Arc<Principal>,
        decoded: Result<Message, (Option<Value>, McpError)>,
    ) -> Resp {
        let (id, method, params) = match decoded {
            Err((id, e)) => return refused(id.as_ref(), &e),
            Ok(Message::Response { id, reply }) => {
                return self.response(req, &principal, id, reply)
            }
            Ok(Message::Notification { method, params }) => {
                return self.notification(req, &principal, &method, &params)
            }
            Ok(Message::Request { id, method, params }) => (id, method, params),
        };
        let declared = Declared::of(&method, &params);
        // `initialize` opens a handshake-era session; 2026-07-28 removed it (and `ping`), so
        // a request that declares 2026-07-28 gets "method not found" for them below.
        if method == "initialize" && !declares_modern(req, &declared) {
            return self.initialize(&id, &params, &principal);
        }
        let era = match self.era(req, &method, &declared, &principal) {
            Ok(era) => era,
            Err(e) => return refused(Some(&id), &e),
        };
        let version = match &era {
            Era::Modern => MODERN_VERSION,
            Era::Legacy(s) => s.version,
        };
        let result = match method.as_str() {
            "ping" if matches!(era, Era::Legacy(_)) => Ok(json!({})),
            "server/discover" if matches!(era, Era::Modern) => Ok(self.discover()),
            "tools/list" => self.list(&params, &principal, version),
            "logging/setLevel" if self.server.is_some() => self.set_log_level(&params, &era),
            crate::relay::endpoint::MCP_METHOD if self.relay.is_some() => {
                self.caller_tool_response(params, &principal)
            }
            "resources/subscribe" | "resources/unsubscribe" if self.server.is_some() => {
                self.subscribe(&method, &params, &principal, &era)
            }
            "subscriptions/listen" if self.server.is_some() && matches!(era, Era::Modern) => {
                return self.listen(id, &params, &principal).await;
            }
            m if passthrough::METHODS.contains(&m) && self.server.is_some() => {
                return self
                    .forward_to_server(&id, m, params, &principal, version)
                    .await;
            }
            other => Err(McpError::MethodNotFound(other.into())),
        };
        match result {
            Ok(r) => result_response(&id, complete(r, version)),
            Err(e) => refused(Some(&id), &e),
        }
    }

    /// A notification: `notifications/cancelled` cancels the session's call it names; every
    /// other one is taken (202) and goes no further.
    fn notification(
        &self,
        req: &Request<Bytes>,
        principal: &Arc<Principal>,
        method: &str,
        params: &Map<String, Value>,
    ) -> Resp {
        match self.session_of(req, principal) {
            Err(e @ McpError::SessionNotFound) => refused(None, &e),
            Ok(Some(s)) if method == "notifications/cancelled" => {
                if let Some(id) = params.get("requestId") {
                    self.in_flight
                        .cancel(&("mcp", s.id.into(), id.to_string().into()));
                }
                accepted()
            }
            _ => accepted(),
        }
    }

    /// `initialize`: negotiate a handshake-era version and open a session.
    fn initialize(&self, id: &Value, params: &Map<String, Value>, principal: &Principal) -> Resp {
        let Some(requested) = params.get("protocolVersion").and_then(Value::as_str) else {
            let e = McpError::InvalidParams("`protocolVersion` is required".into());
            return refused(Some(id), &e);
        };
        let version = LEGACY_VERSIONS
            .iter()
            .find(|v| **v == requested)
            .unwrap_or(&LEGACY_VERSIONS[0]);
        let features = ClientFeatures::of(params.get("capabilities"));
        let opened = self
            .sessions
            .open(version, &principal.id, features, (self.clock)());
        let session = match opened {
            Ok(s) => s,
            Err(e) => return refused(Some(id), &session_error(e)),
        };
        let mut capabilities = self.passed_through();
        capabilities.insert("tools".into(), json!({"listChanged": false}));
        let result = json!({
            "protocolVersion": version,
            "capabilities": capabilities,
            "serverInfo": server_info(),
        });
        let mut resp = result_response(id, result);
        resp.headers_mut().insert(
            SESSION_HEADER,
            HeaderValue::from_str(&session).expect("session ids are visible ASCII"),
        );
        resp
    }

    fn end_session(&self, req: &Request<Bytes>, principal: &Principal) -> Resp {
        let Some(id) = req
            .headers()
            .get(&SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            let e = McpError::Session(format!(
                "`DELETE` ends a session: `{SESSION_HEADER}` is required"
            ));
            return refused(None, &e);
        };
        match self.sessions.end(id, &principal.id, (self.clock)()) {
            Ok(()) => {
                if let Some(server) = &self.server {
                    server.subscriptions().end_session(id);
                }
                let mut r = Resp::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::OK;
                r
            }
            Err(e) => refused(None, &session_error(e)),
        }
    }

    /// `caller_tool_response`: a caller's answer to a relayed call, as on
    /// `/v1/caller-tools/response` (`{stream_id, request_id, result | error}`).
    fn caller_tool_response(
        &self,
        params: Map<String, Value>,
        principal: &Principal,
    ) -> Result<Value, McpError> {
        let relay = self.relay.as_ref().expect("checked");
        crate::relay::endpoint::answer(relay, &principal.id, Value::Object(params)).map_err(
            |r| match r {
                Rejection::InvalidRequest { message, .. } => McpError::InvalidParams(message),
                other => McpError::Refused(other),
            },
        )?;
        Ok(json!({}))
    }

    fn discover(&self) -> Value {
        let mut capabilities = self.passed_through();
        capabilities.insert("tools".into(), json!({}));
        json!({
            "supportedVersions": SUPPORTED_VERSIONS,
            "capabilities": capabilities,
            "ttlMs": self.cfg.list_ttl_ms,
            "cacheScope": "public",
        })
    }

    /// `tools/list`: the tools the caller may call, by name, a page at a time.
    fn list(
        &self,
        params: &Map<String, Value>,
        principal: &Principal,
        version: &str,
    ) -> Result<Value, McpError> {
        let after = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(decode_cursor(c)?),
            Some(_) => return Err(McpError::InvalidParams("`cursor` must be a string".into())),
        };
        let catalog = self.catalog.load();
        let visible = front::visible_tools(&catalog, principal, (self.clock)());
        let filtered = visible.len() < catalog.tools.len();
        let start = match &after {
            None => 0,
            Some(name) => visible.partition_point(|t| t.name.as_str() <= name.as_str()),
        };
        let page: Vec<Value> = visible
            .iter()
            .skip(start)
            .take(self.cfg.page_size)
            .map(|t| tool_definition(t, version))
            .collect();
        let mut result = json!({ "tools": page });
        if start + self.cfg.page_size < visible.len() {
            let last = &visible[start + self.cfg.page_size - 1].name;
            result["nextCursor"] = Value::from(URL_SAFE_NO_PAD.encode(last.as_bytes()));
        }
        if version == MODERN_VERSION {
            result["ttlMs"] = Value::from(self.cfg.list_ttl_ms);
            result["cacheScope"] = Value::from(if filtered { "private" } else { "public" });
        }
        Ok(result)
    }
}

/// What the front answers a request with: the future of its answer, in a box.
type Answer = BoxFuture<Resp>;

/// The front's future: a refusal before any answer, or the answer.
type FrontFuture = futures_util::future::Map<Answer, fn(Resp) -> Result<Resp, Rejection>>;

/// An answer known now.
fn answered(resp: Resp) -> Answer {
    Box::pin(std::future::ready(resp))
}

impl Service<Request<Bytes>> for McpFront {
    type Response = Resp;
    type Error = Rejection;
    type Future = Either<Ready<Result<Resp, Rejection>>, FrontFuture>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        match self.handle(req) {
            Ok(answer) => Either::Right(answer.map(Ok as fn(Resp) -> Result<Resp, Rejection>)),
            Err(r) => Either::Left(std::future::ready(Err(r))),
        }
    }
}

/// An error answer, recorded for the metrics under its reason.
fn refused(id: Option<&Value>, e: &McpError) -> Resp {
    let reason = match e {
        McpError::Refused(r) => r.reason(),
        McpError::SessionNotFound | McpError::Session(_) => "mcp_session",
        McpError::HeaderMismatch(_) => "mcp_header_mismatch",
        McpError::UnsupportedVersion(_) => "protocol_version",
        McpError::Origin(_) => "forbidden_origin",
        McpError::MethodNotFound(_) => "no_route",
        McpError::HttpMethod(_) => "method_not_allowed",
        McpError::InvalidParams(_) | McpError::MissingMeta(_) => "invalid_params",
        McpError::Parse(_) | McpError::InvalidRequest(_) => "invalid_request",
        McpError::Cancelled => "cancelled",
        McpError::Upstream { .. } => "app_error",
    };
    let mut resp = error_response(id, e);
    if let McpError::Refused(r) = e {
        let code = crate::errors::tools_v1(r).0;
        resp.extensions_mut().insert(front::RefusalCode(code));
    }
    front::recorded(resp, None, reason)
}

/// `202 Accepted`, no body: a notification or a response.
fn accepted() -> Resp {
    let mut r = Resp::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}

fn server_info() -> Value {
    json!({"name": "carapace", "version": env!("CARGO_PKG_VERSION")})
}

/// A 2026-07-28 result carries `resultType` (`complete` unless the server said otherwise, as
/// in an "input required" result) and the server's identity; older ones do not.
fn complete(mut result: Value, version: &str) -> Value {
    if version == MODERN_VERSION {
        if !result.get("resultType").is_some_and(Value::is_string) {
            result["resultType"] = Value::from("complete");
        }
        let meta = result
            .as_object_mut()
            .expect("results are objects")
            .entry("_meta")
            .or_insert_with(|| json!({}));
        meta[META_SERVER_INFO] = server_info();
    }
    result
}

fn decode_cursor(c: &str) -> Result<String, McpError> {
    URL_SAFE_NO_PAD
        .decode(c)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| McpError::InvalidParams("`cursor` is not one this server gave".into()))
}
