//! The caller's stream while its `tools/call` runs: where the MCP server's notifications
//! (progress, log messages) and its requests to the client (sampling, elicitation, roots) for
//! that call go, and where the caller's answers come back from.
//!
//! The MCP front makes a [`CallerStream`] for each call of a caller that takes
//! `text/event-stream`, and hands it to the back in the call's extensions. The back sends
//! upstream a progress token of its own (the server sees no caller's token, and two callers'
//! tokens never collide on the one upstream session) and gives the caller's token back on
//! each progress notification. A request is relayed only when the caller declared the
//! capability it needs; otherwise the server gets an error for it at once, never a hang.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::upstream::Reply;

/// Most messages waiting to be written to one caller's stream; a server that sends faster
/// than the caller reads loses notifications (counted in the log), never requests.
const QUEUE: usize = 64;

/// What the caller said it can do (its `capabilities` at `initialize`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientFeatures(u8);

impl ClientFeatures {
    const SAMPLING: u8 = 1;
    const ELICITATION: u8 = 2;
    const ROOTS: u8 = 4;

    /// From an `initialize` request's `capabilities`.
    pub fn of(capabilities: Option<&Value>) -> Self {
        let has = |k: &str| {
            capabilities
                .and_then(|c| c.get(k))
                .is_some_and(Value::is_object)
        };
        let mut bits = 0;
        for (key, bit) in [
            ("sampling", Self::SAMPLING),
            ("elicitation", Self::ELICITATION),
            ("roots", Self::ROOTS),
        ] {
            if has(key) {
                bits |= bit;
            }
        }
        ClientFeatures(bits)
    }

    pub fn bits(self) -> u8 {
        self.0
    }

    pub fn from_bits(bits: u8) -> Self {
        ClientFeatures(bits & (Self::SAMPLING | Self::ELICITATION | Self::ROOTS))
    }

    /// These capabilities as a client declares them.
    pub fn declared(self) -> Value {
        let mut caps = serde_json::Map::new();
        for (key, bit, value) in [
            ("sampling", Self::SAMPLING, serde_json::json!({})),
            (
                "elicitation",
                Self::ELICITATION,
                serde_json::json!({"form": {}}),
            ),
            ("roots", Self::ROOTS, serde_json::json!({})),
        ] {
            if self.0 & bit != 0 {
                caps.insert(key.into(), value);
            }
        }
        Value::Object(caps)
    }

    /// Whether a server request of `method` may be put to this caller.
    pub fn answers(self, method: &str) -> bool {
        let bit = match method {
            "sampling/createMessage" => Self::SAMPLING,
            "elicitation/create" => Self::ELICITATION,
            "roots/list" => Self::ROOTS,
            _ => return false,
        };
        self.0 & bit != 0
    }
}

/// A message from the server for the caller.
#[derive(Debug)]
pub enum ServerMessage {
    Notification {
        method: String,
        params: Value,
    },
    /// A request: the caller's answer goes back through `answer`.
    Request {
        method: String,
        params: Value,
        answer: oneshot::Sender<Reply>,
    },
}

/// The caller's stream for one call; cheap to clone.
#[derive(Debug, Clone)]
pub struct CallerStream {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<ServerMessage>,
    /// The caller's `_meta.progressToken`, if it asked for progress.
    caller_token: Option<Value>,
    /// The token the server is given instead.
    upstream_token: String,
    features: ClientFeatures,
    /// Whether requests can be put to the caller (an older-era session, which posts its
    /// answers); a 2026-07-28 caller answers "input required" results instead.
    askable: bool,
    /// The least severe log message the caller is sent; `None`: none at all.
    log_level: Option<u8>,
}

impl CallerStream {
    /// A stream for a call whose caller asked for progress with `progress_token`, and for
    /// log messages from `log_level` up (a rank in [`LOG_LEVELS`]); `features` are what it
    /// declared, and requests are put to it only when it is `askable`.
    pub fn new(
        progress_token: Option<Value>,
        features: ClientFeatures,
        askable: bool,
        log_level: Option<u8>,
    ) -> (Self, mpsc::Receiver<ServerMessage>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let inner = Inner {
            tx,
            caller_token: progress_token,
            upstream_token: format!("carapace-{}", hex::encode(rand::random::<[u8; 12]>())),
            features,
            askable,
            log_level,
        };
        (
            CallerStream {
                inner: Arc::new(inner),
            },
            rx,
        )
    }

    /// The progress token to send the server, when the caller asked for progress.
    pub fn upstream_token(&self) -> Option<&str> {
        self.inner
            .caller_token
            .as_ref()
            .map(|_| self.inner.upstream_token.as_str())
    }

    /// Whether a progress notification naming `token` is this call's.
    pub fn owns_token(&self, token: &Value) -> bool {
        self.upstream_token().is_some_and(|t| token == t)
    }

    /// Whether a server request of `method` may be put to this caller.
    pub fn answers(&self, method: &str) -> bool {
        self.inner.askable && self.inner.features.answers(method)
    }

    /// Whether requests can be put to the caller at all (an older-era caller).
    pub fn askable(&self) -> bool {
        self.inner.askable
    }

    /// What the caller declared it can answer.
    pub fn features(&self) -> ClientFeatures {
        self.inner.features
    }

    /// The least severe log level the caller wants, if it wants log messages.
    pub fn log_level(&self) -> Option<&'static str> {
        self.inner.log_level.map(|l| LOG_LEVELS[usize::from(l)])
    }

    /// Pass a notification on; a progress notification gets the caller's token back, and a
    /// log message goes on only at or above the caller's level.
    pub fn notify(&self, method: &str, mut params: Value) {
        if method == "notifications/message" {
            let level = params
                .get("level")
                .and_then(Value::as_str)
                .and_then(log_level);
            match (self.inner.log_level, level) {
                (Some(wanted), Some(l)) if l >= wanted => {}
                (Some(_), None) => {}
                _ => return,
            }
        }
        if method == "notifications/progress" {
            let Some(token) = &self.inner.caller_token else {
                return;
            };
            if !params
                .get("progressToken")
                .is_some_and(|t| self.owns_token(t))
            {
                return;
            }
            params["progressToken"] = token.clone();
        }
        let msg = ServerMessage::Notification {
            method: method.to_owned(),
            params,
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = self.inner.tx.try_send(msg) {
            tracing::warn!("mcp_notification_dropped method={method}: the caller reads too slowly");
        }
    }

    /// Put a request to the caller and wait for its answer. A caller that is gone answers
    /// with an error.
    pub async fn ask(&self, method: &str, params: Value) -> Reply {
        let (answer, reply) = oneshot::channel();
        let msg = ServerMessage::Request {
            method: method.to_owned(),
            params,
            answer,
        };
        if self.inner.tx.send(msg).await.is_err() {
            return gone();
        }
        reply.await.unwrap_or_else(|_| gone())
    }
}

fn gone() -> Reply {
    Reply::Error {
        code: -32603,
        message: "the caller's stream is closed".into(),
        data: None,
    }
}

/// Log message levels in order of severity (`logging/setLevel`).
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// The rank of a level name, if it is one.
pub fn log_level(name: &str) -> Option<u8> {
    LOG_LEVELS.iter().position(|l| *l == name).map(|p| p as u8)
}

/// A 2026-07-28 caller's answers to an "input required" result, sent with its retried
/// request (`inputResponses`, `requestState`) and passed on to the server as they are.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryInput(pub serde_json::Map<String, Value>);

impl RetryInput {
    /// The retry fields of a request's params, if it has any.
    pub fn of(params: &serde_json::Map<String, Value>) -> Option<Self> {
        let fields: serde_json::Map<String, Value> = ["inputResponses", "requestState"]
            .into_iter()
            .filter_map(|k| params.get(k).map(|v| (k.to_owned(), v.clone())))
            .collect();
        (!fields.is_empty()).then_some(RetryInput(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_are_put_only_to_callers_that_declared_the_capability() {
        let f = ClientFeatures::of(Some(
            &json!({"sampling": {}, "roots": {"listChanged": true}}),
        ));
        assert!(f.answers("sampling/createMessage"));
        assert!(f.answers("roots/list"));
        assert!(!f.answers("elicitation/create"));
        assert!(!f.answers("tools/call"));
        assert_eq!(ClientFeatures::from_bits(f.bits()), f);
        assert!(!ClientFeatures::of(None).answers("roots/list"));
        assert_eq!(f.declared(), json!({"sampling": {}, "roots": {}}));
        let (modern, _rx) = CallerStream::new(None, f, false, None);
        assert!(!modern.answers("sampling/createMessage"), "not askable");
    }

    #[tokio::test]
    async fn progress_carries_the_callers_token_and_only_this_calls_progress_passes() {
        let (s, mut rx) = CallerStream::new(Some(json!(7)), ClientFeatures::default(), true, None);
        let ours = s.upstream_token().unwrap().to_owned();
        s.notify(
            "notifications/progress",
            json!({"progressToken": "someone-else", "progress": 1}),
        );
        s.notify(
            "notifications/progress",
            json!({"progressToken": ours, "progress": 2}),
        );
        let Some(ServerMessage::Notification { params, .. }) = rx.recv().await else {
            panic!("a notification")
        };
        assert_eq!(params, json!({"progressToken": 7, "progress": 2}));
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn log_messages_go_only_to_a_caller_that_asked_at_or_above_its_level() {
        let msg = |level: &str| json!({"level": level, "data": level});
        let (none, mut rx) = CallerStream::new(None, ClientFeatures::default(), true, None);
        none.notify("notifications/message", msg("error"));
        assert!(rx.try_recv().is_err(), "no level asked: no log messages");
        let (warn, mut rx) =
            CallerStream::new(None, ClientFeatures::default(), true, log_level("warning"));
        assert_eq!(warn.log_level(), Some("warning"));
        for l in ["debug", "info", "warning", "emergency"] {
            warn.notify("notifications/message", msg(l));
        }
        let mut got = Vec::new();
        while let Ok(ServerMessage::Notification { params, .. }) = rx.try_recv() {
            got.push(params["level"].as_str().unwrap().to_owned());
        }
        assert_eq!(got, ["warning", "emergency"]);
    }

    #[test]
    fn a_retry_carries_only_the_callers_answers_and_the_servers_state() {
        let p = json!({"name": "t", "inputResponses": {"a": {"action": "accept"}}, "requestState": "s"});
        let r = RetryInput::of(p.as_object().unwrap()).unwrap();
        assert_eq!(
            Value::Object(r.0),
            json!({"inputResponses": {"a": {"action": "accept"}}, "requestState": "s"})
        );
        assert!(RetryInput::of(json!({"name": "t"}).as_object().unwrap()).is_none());
    }

    #[tokio::test]
    async fn a_caller_that_is_gone_answers_with_an_error() {
        let (s, rx) = CallerStream::new(None, ClientFeatures::default(), true, None);
        drop(rx);
        assert!(matches!(
            s.ask("roots/list", json!({})).await,
            Reply::Error { .. }
        ));
        assert_eq!(s.upstream_token(), None);
    }
}
