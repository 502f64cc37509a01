//! A client of one MCP server over either transport: the protocol revision negotiated with it
//! (as the specification says: `server/discover` for 2026-07-28, else `initialize`), requests
//! in that revision, and discovery of all its tools.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::Notify;

use carapace_filters::{BoxFuture, Rejection};

use super::negotiate::{
    handshake, meta_of, negotiate, with_meta, META_CAPABILITIES, META_LOG_LEVEL,
};
use super::relay::CallerStream;
use crate::mcp::subscriptions::{
    SubscriptionHub, ACKNOWLEDGED, PROMPTS_CHANGED, RESOURCES_CHANGED, UPDATED,
};
use crate::mcp::MODERN_VERSION;

/// Most `tools/list` pages read in one discovery.
const MAX_PAGES: usize = 64;

/// The revision agreed with the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub version: String,
    /// 2026-07-28: every request carries its version, and mirrors method and tool in headers.
    pub modern: bool,
    /// The `Mcp-Session-Id` an HTTP server gave at `initialize`.
    pub session: Option<String>,
    /// What the server said it offers (`capabilities` of its discover or initialize answer).
    pub capabilities: Value,
}

/// A JSON-RPC request to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub method: String,
    pub params: Value,
    /// The tool a `tools/call` names (mirrored into `Mcp-Name` on HTTP).
    pub tool: Option<String>,
    /// The revision to speak; `None` while negotiating.
    pub session: Option<Arc<Negotiated>>,
    /// The caller's stream, for the server's notifications and requests about this request.
    pub relay: Option<CallerStream>,
}

/// The server's answer to a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Result(Value),
    Error {
        code: i64,
        message: String,
        data: Option<Value>,
    },
}

impl Reply {
    /// This outcome as the JSON-RPC response to the request `id`.
    pub fn into_response(self, id: Value) -> Value {
        match self {
            Reply::Result(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
            Reply::Error {
                code,
                message,
                data,
            } => {
                let mut e = json!({"code": code, "message": message});
                if let Some(d) = data {
                    e["data"] = d;
                }
                json!({"jsonrpc": "2.0", "id": id, "error": e})
            }
        }
    }

    /// A JSON-RPC response object's outcome.
    pub fn from_response(msg: &Value) -> Option<Reply> {
        if let Some(r) = msg.get("result") {
            return Some(Reply::Result(r.clone()));
        }
        let e = msg.get("error")?;
        Some(Reply::Error {
            code: e.get("code").and_then(Value::as_i64).unwrap_or(-32603),
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            data: e.get("data").cloned(),
        })
    }
}

/// What a transport answers.
#[derive(Debug)]
pub enum Answer {
    Reply {
        reply: Reply,
        /// `Mcp-Session-Id` of an HTTP answer.
        session: Option<String>,
    },
    /// The server no longer knows the session (HTTP 404): negotiate again.
    SessionGone,
}

/// Where a transport passes what the server announces outside any call: its tools changed
/// (rediscovery), and the notifications callers subscribe to.
#[derive(Debug, Clone, Default)]
pub struct Notices {
    pub tools_changed: Arc<Notify>,
    pub subscriptions: Arc<SubscriptionHub>,
}

impl Notices {
    /// Take the notification `method` if it is one of these; whether it was.
    pub fn take(&self, method: &str, params: &Value) -> bool {
        match method {
            "notifications/tools/list_changed" => self.tools_changed.notify_one(),
            UPDATED | RESOURCES_CHANGED | PROMPTS_CHANGED | ACKNOWLEDGED => {
                self.subscriptions.deliver(method, params)
            }
            _ => return false,
        }
        true
    }
}

/// How requests reach a server: a child's stdio, or Streamable HTTP.
pub trait Transport: Send + Sync + 'static {
    /// Changes whenever the connection is new (a restarted child): the revision must be
    /// negotiated again.
    fn generation(&self) -> u64;
    fn request(&self, msg: Outgoing) -> BoxFuture<Result<Answer, Rejection>>;
    fn notify(&self, msg: Outgoing) -> BoxFuture<Result<(), Rejection>>;
    /// Whether a handshake session can run beside 2026-07-28 requests (Streamable HTTP,
    /// where each has its own requests; not one stdio stream).
    fn sessions_alongside(&self) -> bool {
        false
    }
    /// Receive what the server says outside any request in the handshake session `session`
    /// (its standalone stream), until it ends; on stdio everything arrives on the one stream
    /// already, and this never ends.
    fn events(&self, session: Arc<Negotiated>) -> BoxFuture<Result<(), Rejection>> {
        let _ = session;
        Box::pin(std::future::pending())
    }
}

/// The handshake session of a connection (its generation), or `None` when the server refused
/// `initialize` on it.
type HandshakeSlot = Mutex<Option<(u64, Option<Arc<Negotiated>>)>>;

/// One MCP server behind carapace.
pub struct McpUpstream {
    transport: Box<dyn Transport>,
    negotiated: Mutex<Option<(u64, Arc<Negotiated>)>>,
    negotiating: tokio::sync::Mutex<()>,
    /// A handshake session beside a 2026-07-28 one, for callers of the older era: the server
    /// can put its requests (sampling, elicitation, roots) to them as they expect. `None`
    /// inside: the server refused `initialize` on this connection.
    handshake: HandshakeSlot,
    handshaking: tokio::sync::Mutex<()>,
    notices: Notices,
    /// Whether the task asking the server for the callers' subscriptions runs.
    listening: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for McpUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpUpstream")
            .field("negotiated", &self.negotiated.lock().expect("lock"))
            .finish()
    }
}

impl McpUpstream {
    /// `notices` are the ones `transport` passes the server's announcements to.
    pub fn new(transport: Box<dyn Transport>, notices: Notices) -> Self {
        McpUpstream {
            transport,
            negotiated: Mutex::new(None),
            negotiating: tokio::sync::Mutex::new(()),
            handshake: Mutex::new(None),
            handshaking: tokio::sync::Mutex::new(()),
            notices,
            listening: Default::default(),
        }
    }

    /// Notified when the server's tools changed.
    pub fn list_changed(&self) -> &Arc<Notify> {
        &self.notices.tools_changed
    }

    /// The callers' subscriptions to the server's notifications; carapace asks the server for
    /// what they want from the first use on ([`super::listen`]).
    pub fn subscriptions(self: &Arc<Self>) -> &Arc<SubscriptionHub> {
        use std::sync::atomic::Ordering;
        if !self.listening.swap(true, Ordering::AcqRel) {
            let hub = self.notices.subscriptions.clone();
            tokio::spawn(super::listen::keep_listening(Arc::downgrade(self), hub));
        }
        &self.notices.subscriptions
    }

    /// Receive what the server says outside any request in `session`, until that ends.
    pub async fn events(&self, session: Arc<Negotiated>) -> Result<(), Rejection> {
        self.transport.events(session).await
    }

    /// The revision agreed with the current connection, negotiated if need be.
    pub async fn session(&self) -> Result<Arc<Negotiated>, Rejection> {
        if let Some(n) = self.current() {
            return Ok(n);
        }
        let _one = self.negotiating.lock().await;
        if let Some(n) = self.current() {
            return Ok(n);
        }
        let before = self.transport.generation();
        let n = Arc::new(negotiate(self.transport.as_ref()).await?);
        // A command that was not running yet (generation 0) started while it was negotiated
        // with: the agreement is that connection's.
        let generation = match before {
            0 => self.transport.generation(),
            g => g,
        };
        tracing::info!(
            "mcp_server_negotiated version={} session={}",
            n.version,
            n.session.is_some()
        );
        *self.negotiated.lock().expect("lock") = Some((generation, n.clone()));
        Ok(n)
    }

    /// The revision agreed with the current connection, if one was.
    pub fn negotiated(&self) -> Option<Arc<Negotiated>> {
        self.current()
    }

    fn current(&self) -> Option<Arc<Negotiated>> {
        let generation = self.transport.generation();
        match &*self.negotiated.lock().expect("lock") {
            Some((g, n)) if *g == generation => Some(n.clone()),
            _ => None,
        }
    }

    /// The session a request is sent in: the negotiated one, or for a caller of the older era
    /// that can be asked, a handshake session beside a 2026-07-28 one when the server accepts
    /// `initialize` too (tried once per connection; the negotiated one serves otherwise).
    async fn session_for(
        &self,
        relay: Option<&CallerStream>,
    ) -> Result<Arc<Negotiated>, Rejection> {
        let n = self.session().await?;
        let older_caller = relay.is_some_and(CallerStream::askable);
        if !(n.modern && older_caller && self.transport.sessions_alongside()) {
            return Ok(n);
        }
        let generation = self.transport.generation();
        let known = |slot: &HandshakeSlot| match &*slot.lock().expect("lock") {
            Some((g, h)) if *g == generation => Some(h.clone().unwrap_or_else(|| n.clone())),
            _ => None,
        };
        if let Some(h) = known(&self.handshake) {
            return Ok(h);
        }
        let _one = self.handshaking.lock().await;
        if let Some(h) = known(&self.handshake) {
            return Ok(h);
        }
        let h = match handshake(self.transport.as_ref()).await {
            Ok(h) => {
                tracing::info!(
                    "mcp_server_handshake version={} beside {MODERN_VERSION}",
                    h.version
                );
                Some(Arc::new(h))
            }
            Err(e) => {
                tracing::info!("mcp_server_handshake_refused: {e}; {MODERN_VERSION} serves all");
                None
            }
        };
        *self.handshake.lock().expect("lock") = Some((generation, h.clone()));
        Ok(h.unwrap_or(n))
    }

    /// Forget `session` (the server lost it), wherever it is kept.
    fn forget(&self, session: &Arc<Negotiated>) {
        let mut n = self.negotiated.lock().expect("lock");
        if n.as_ref().is_some_and(|(_, s)| Arc::ptr_eq(s, session)) {
            *n = None;
        }
        let mut h = self.handshake.lock().expect("lock");
        if h.as_ref()
            .is_some_and(|(_, s)| s.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)))
        {
            *h = None;
        }
    }

    /// Send `method` in the agreed revision; a session the server lost is negotiated again
    /// once.
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        tool: Option<&str>,
    ) -> Result<Reply, Rejection> {
        self.request_relayed(method, params, tool, None).await
    }

    /// [`Self::request`], with the server's notifications and requests about it passed to
    /// the caller's stream.
    pub async fn request_relayed(
        &self,
        method: &str,
        mut params: Value,
        tool: Option<&str>,
        relay: Option<CallerStream>,
    ) -> Result<Reply, Rejection> {
        if let Some(token) = relay.as_ref().and_then(CallerStream::upstream_token) {
            meta_of(&mut params).insert("progressToken".into(), Value::from(token));
        }
        for _ in 0..2 {
            let session = self.session_for(relay.as_ref()).await?;
            let mut params = with_meta(params.clone(), &session);
            if let (Some(relay), true) = (&relay, session.modern) {
                // A 2026-07-28 server asks only for what the caller can answer, and sends
                // log messages only when asked, at the caller's level.
                let meta = meta_of(&mut params);
                meta.insert(META_CAPABILITIES.into(), relay.features().declared());
                if let Some(level) = relay.log_level() {
                    meta.insert(META_LOG_LEVEL.into(), Value::from(level));
                }
            }
            let msg = Outgoing {
                method: method.to_owned(),
                params,
                tool: tool.map(str::to_owned),
                session: Some(session.clone()),
                relay: relay.clone(),
            };
            match self.transport.request(msg).await? {
                Answer::Reply { reply, .. } => return Ok(reply),
                Answer::SessionGone => {
                    tracing::info!("mcp_server_session_lost: negotiating again");
                    self.forget(&session);
                }
            }
        }
        Err(Rejection::AppUnavailable(
            "the MCP server lost the session twice".into(),
        ))
    }

    /// Every tool the server offers, all pages.
    pub async fn list_tools(&self) -> Result<Vec<Value>, Rejection> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = match &cursor {
                Some(c) => json!({ "cursor": c }),
                None => json!({}),
            };
            let page = match self.request("tools/list", params, None).await? {
                Reply::Result(r) => r,
                Reply::Error { code, message, .. } => {
                    return Err(Rejection::AppInvalid(format!(
                        "tools/list failed: {code} {message}"
                    )))
                }
            };
            let Some(list) = page.get("tools").and_then(Value::as_array) else {
                return Err(Rejection::AppInvalid(
                    "tools/list: `tools` is not an array".into(),
                ));
            };
            tools.extend(list.iter().cloned());
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(c) if !c.is_empty() && cursor.as_deref() != Some(c) => {
                    cursor = Some(c.to_owned())
                }
                _ => return Ok(tools),
            }
        }
        Err(Rejection::AppInvalid(format!(
            "tools/list has more than {MAX_PAGES} pages"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::back::negotiate::META_VERSION;
    use crate::mcp::LEGACY_VERSIONS;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A scripted server: answers by method, and records what it was sent.
    struct Scripted {
        modern: bool,
        sent: Mutex<Vec<Outgoing>>,
        generation: AtomicU64,
        lose_session_once: std::sync::atomic::AtomicBool,
    }

    impl Transport for Scripted {
        fn generation(&self) -> u64 {
            self.generation.load(Ordering::SeqCst)
        }
        fn request(&self, msg: Outgoing) -> BoxFuture<Result<Answer, Rejection>> {
            self.sent.lock().unwrap().push(msg.clone());
            // A command starts when it is first written to.
            let _ = self
                .generation
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
            let reply = match msg.method.as_str() {
                "server/discover" if self.modern => {
                    Reply::Result(json!({"supportedVersions": [MODERN_VERSION]}))
                }
                "initialize" if !self.modern => {
                    Reply::Result(json!({"protocolVersion": "2025-06-18"}))
                }
                "tools/list" if self.lose_session_once.swap(false, Ordering::SeqCst) => {
                    return Box::pin(async { Ok(Answer::SessionGone) });
                }
                "tools/list" => {
                    let page = match msg.params.get("cursor").and_then(Value::as_str) {
                        None => json!({"tools": [{"name": "a"}], "nextCursor": "2"}),
                        Some(_) => json!({"tools": [{"name": "b"}]}),
                    };
                    Reply::Result(page)
                }
                _ => Reply::Error {
                    code: -32601,
                    message: "Method not found".into(),
                    data: None,
                },
            };
            let session = Some(format!("s{}", self.sent.lock().unwrap().len()));
            Box::pin(async move { Ok(Answer::Reply { reply, session }) })
        }
        fn notify(&self, msg: Outgoing) -> BoxFuture<Result<(), Rejection>> {
            self.sent.lock().unwrap().push(msg);
            Box::pin(async { Ok(()) })
        }
    }

    fn upstream(modern: bool) -> (Arc<Scripted>, McpUpstream) {
        let s = Arc::new(Scripted {
            modern,
            sent: Mutex::default(),
            generation: AtomicU64::new(1),
            lose_session_once: false.into(),
        });
        struct Shared(Arc<Scripted>);
        impl Transport for Shared {
            fn generation(&self) -> u64 {
                self.0.generation()
            }
            fn request(&self, m: Outgoing) -> BoxFuture<Result<Answer, Rejection>> {
                self.0.request(m)
            }
            fn notify(&self, m: Outgoing) -> BoxFuture<Result<(), Rejection>> {
                self.0.notify(m)
            }
        }
        let u = McpUpstream::new(Box::new(Shared(s.clone())), Notices::default());
        (s, u)
    }

    fn methods(s: &Scripted) -> Vec<String> {
        s.sent
            .lock()
            .unwrap()
            .iter()
            .map(|m| m.method.clone())
            .collect()
    }

    #[tokio::test]
    async fn a_command_that_starts_while_it_is_negotiated_with_is_not_negotiated_with_again() {
        let (s, u) = upstream(true);
        s.generation.store(0, Ordering::SeqCst);
        u.list_tools().await.unwrap();
        u.list_tools().await.unwrap();
        assert_eq!(
            methods(&s)
                .iter()
                .filter(|m| *m == "server/discover")
                .count(),
            1
        );
        assert!(u.negotiated().is_some());
    }

    #[tokio::test]
    async fn a_modern_server_is_spoken_to_statelessly_with_meta_on_every_request() {
        let (s, u) = upstream(true);
        let tools = u.list_tools().await.unwrap();
        assert_eq!(tools, vec![json!({"name": "a"}), json!({"name": "b"})]);
        assert_eq!(methods(&s), ["server/discover", "tools/list", "tools/list"]);
        let sent = s.sent.lock().unwrap();
        assert_eq!(sent[2].params["cursor"], "2");
        assert_eq!(sent[2].params["_meta"][META_VERSION], MODERN_VERSION);
        assert!(sent[2].session.as_ref().unwrap().modern);
    }

    #[tokio::test]
    async fn an_older_server_is_initialized_and_a_restart_or_lost_session_negotiates_again() {
        let (s, u) = upstream(false);
        u.list_tools().await.unwrap();
        assert_eq!(
            methods(&s),
            [
                "server/discover",
                "initialize",
                "notifications/initialized",
                "tools/list",
                "tools/list"
            ]
        );
        {
            let sent = s.sent.lock().unwrap();
            assert_eq!(sent[1].params["protocolVersion"], LEGACY_VERSIONS[0]);
            let session = sent[3].session.as_ref().unwrap();
            assert_eq!(session.version, "2025-06-18");
            assert_eq!(session.session.as_deref(), Some("s2"));
            assert!(sent[3].params.get("_meta").is_none());
        }
        s.sent.lock().unwrap().clear();
        s.generation.store(2, Ordering::SeqCst);
        s.lose_session_once.store(true, Ordering::SeqCst);
        u.request("tools/list", json!({}), None).await.unwrap();
        // New child: negotiate; lost session: negotiate again, then the request.
        assert_eq!(
            methods(&s),
            [
                "server/discover",
                "initialize",
                "notifications/initialized",
                "tools/list",
                "server/discover",
                "initialize",
                "notifications/initialized",
                "tools/list"
            ]
        );
    }
}
