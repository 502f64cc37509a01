//! A `tools/call` answered as an SSE stream: when the MCP server says something to the caller
//! while the call runs (progress, a log message, a request such as sampling or elicitation),
//! the answer becomes `text/event-stream` carrying those messages in order and then the
//! call's response. A call the server says nothing about is answered as plain JSON, as before.
//!
//! A request the server puts to the caller gets an id carapace makes (unguessable, so no
//! other caller can answer it), bound to the caller's session: only a response posted in that
//! session, with that id, reaches the server. If the caller goes away the call is dropped,
//! which cancels it at the server.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::back::relay::ServerMessage;
use super::back::upstream::Reply;
use crate::edge::{StreamBody, StreamedBody};
use crate::front::Resp;
use crate::ops::call_fields::CallScope;
use crate::receipts::{RECEIPT_HEADER, RECEIPT_STATUS_HEADER};
use carapace_filters::secret_guard::SecretGuard;

/// Most requests of the server waiting for callers' answers, over all sessions.
const MAX_PENDING: usize = 10_000;
/// SSE frames written ahead of a slow caller.
const FRAMES: usize = 16;

type Call = Pin<Box<dyn Future<Output = Resp> + Send>>;

/// How the ids carapace gives the server's requests begin.
const ANSWER_ID_PREFIX: &str = "carapace-";

/// Whether `id` has the form of an id carapace gives a server's request.
pub fn is_answer_id(id: &Value) -> bool {
    id.as_str().is_some_and(|s| s.starts_with(ANSWER_ID_PREFIX))
}

/// The server's requests waiting for a caller's answer, by session and the id carapace gave.
#[derive(Debug, Default)]
pub struct PendingAnswers {
    waiting: Mutex<HashMap<(String, String), oneshot::Sender<Reply>>>,
}

impl PendingAnswers {
    /// Wait for an answer in `session`; the id to put on the request, or `None` when too many
    /// are waiting (the request is then answered with an error).
    fn wait(&self, session: &str, answer: oneshot::Sender<Reply>) -> Option<String> {
        let mut waiting = self.lock();
        if waiting.len() >= MAX_PENDING {
            waiting.retain(|_, tx| !tx.is_closed());
            if waiting.len() >= MAX_PENDING {
                return None;
            }
        }
        let id = format!(
            "{ANSWER_ID_PREFIX}{}",
            hex::encode(rand::random::<[u8; 16]>())
        );
        waiting.insert((session.to_owned(), id.clone()), answer);
        Some(id)
    }

    /// Deliver a caller's answer; whether a request was waiting for it in that session.
    pub fn deliver(&self, session: &str, id: Option<&Value>, reply: Reply) -> bool {
        let Some(id) = id.and_then(Value::as_str) else {
            return false;
        };
        let tx = self.lock().remove(&(session.to_owned(), id.to_owned()));
        tx.is_some_and(|tx| tx.send(reply).is_ok())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), oneshot::Sender<Reply>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where a streamed answer's requests wait for their answers.
#[derive(Clone)]
pub struct StreamContext {
    pub answers: Arc<PendingAnswers>,
    /// The caller's session (older era); a caller without one is put no requests.
    pub session: Option<String>,
    /// The tool-host side's secret guard and the tool called: what the server says during
    /// the call leaves the tool-host side as its result does.
    pub guard: Option<(Arc<SecretGuard>, String)>,
    /// Whether this host signs receipts and the caller takes trailers: a streamed answer then
    /// announces the `Carapace-Receipt` trailer and sends it after the response.
    pub receipts: bool,
}

impl StreamContext {
    /// Whether a message may go to the caller (its method and params redacted in place when
    /// the guard says so: a server picks its notifications' method names too).
    fn guarded(&self, method: &mut String, params: &mut Value) -> bool {
        let Some((guard, tool)) = &self.guard else {
            return true;
        };
        let mut name = Value::String(std::mem::take(method));
        let ok = guard
            .check(tool, [("/method", &mut name), ("/params", params)])
            .is_ok();
        if let Value::String(s) = name {
            *method = s;
        }
        ok
    }

    /// The SSE frame for one message of the server, if it goes to the caller. A message the
    /// secret guard refuses is dropped; a refused request is answered to the server with an
    /// error instead.
    fn frame(&self, msg: ServerMessage) -> Option<Bytes> {
        let doc = match msg {
            ServerMessage::Notification {
                mut method,
                mut params,
            } => {
                if !self.guarded(&mut method, &mut params) {
                    return None;
                }
                json!({"jsonrpc": "2.0", "method": method, "params": params})
            }
            ServerMessage::Request {
                mut method,
                mut params,
                answer,
            } => {
                if !self.guarded(&mut method, &mut params) {
                    let _ = answer.send(Reply::Error {
                        code: super::jsonrpc::INTERNAL_ERROR,
                        message: "carapace withheld this request from the caller: it carries a credential".into(),
                        data: None,
                    });
                    return None;
                }
                let session = self.session.as_deref()?;
                let id = self.answers.wait(session, answer)?;
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            }
        };
        Some(event(
            &serde_json::to_vec(&doc).expect("JSON values serialize"),
        ))
    }
}

/// One SSE event carrying a JSON-RPC message (compact JSON holds no newline).
pub fn event(json: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(json.len() + 24);
    b.extend_from_slice(b"event: message\ndata: ");
    b.extend_from_slice(json);
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

/// Answer with `call`'s response: as it is when the server says nothing first, else as an SSE
/// stream of the server's messages and then the response. The response's head is sent before
/// the call ends, so a streamed answer carries the call's receipt headers
/// (`Carapace-Receipt`, `Carapace-Receipt-Status`) as HTTP trailers after the last event.
pub async fn respond(
    mut call: Call,
    mut messages: mpsc::Receiver<ServerMessage>,
    cx: StreamContext,
) -> Resp {
    // Messages first: the server said them before it answered.
    let first = tokio::select! {
        biased;
        first = messages.recv() => first,
        resp = &mut call => match messages.try_recv() {
            Ok(first) => return stream_with(Box::pin(std::future::ready(resp)), messages, first, cx),
            Err(_) => return resp,
        },
    };
    let Some(first) = first else {
        return call.await;
    };
    stream_with(call, messages, first, cx)
}

/// The SSE answer: a task writes `first`, the messages after it, and then the response.
fn stream_with(
    call: Call,
    messages: mpsc::Receiver<ServerMessage>,
    first: ServerMessage,
    cx: StreamContext,
) -> Resp {
    let (tx, rx) = mpsc::channel(FRAMES);
    let receipts = cx.receipts;
    let pump = pump(call, messages, first, cx, tx);
    tokio::spawn(CallScope::current().wrap(pump));
    let mut resp = sse_response(FrameBody(rx).boxed_unsync());
    if receipts {
        resp.headers_mut().insert(
            http::header::TRAILER,
            HeaderValue::from_static(RECEIPT_TRAILERS),
        );
    }
    resp
}

/// The trailers a streamed answer of a host that signs receipts announces.
const RECEIPT_TRAILERS: &str = "Carapace-Receipt, Carapace-Receipt-Status";

/// The receipt headers of the call's response, sent as trailers after a streamed answer.
fn receipt_trailers(resp: &Resp) -> Option<http::HeaderMap> {
    let mut trailers = http::HeaderMap::new();
    for name in [RECEIPT_HEADER, RECEIPT_STATUS_HEADER] {
        if let Some(v) = resp.headers().get(&name) {
            trailers.insert(name, v.clone());
        }
    }
    (!trailers.is_empty()).then_some(trailers)
}

/// A `200 text/event-stream` answer whose body is `body`, streamed by the edge.
pub fn sse_response(body: StreamBody) -> Resp {
    let mut resp = Resp::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    resp.extensions_mut().insert(StreamedBody::new(body));
    resp
}

/// Write the server's messages and then the call's response to the caller's stream; stop
/// (dropping the call, which cancels it) when the caller is gone.
async fn pump(
    mut call: Call,
    mut messages: mpsc::Receiver<ServerMessage>,
    first: ServerMessage,
    cx: StreamContext,
    tx: mpsc::Sender<Frame<Bytes>>,
) {
    let mut next = Some(first);
    let mut open = true;
    loop {
        if let Some(frame) = next.take().and_then(|m| cx.frame(m)) {
            if tx.send(Frame::data(frame)).await.is_err() {
                return;
            }
        }
        tokio::select! {
            resp = &mut call => {
                // What the server said before it answered, in order; a request can no longer
                // be answered (its call is over) and is not sent.
                while let Ok(m) = messages.try_recv() {
                    let m @ ServerMessage::Notification { .. } = m else { continue };
                    if let Some(frame) = cx.frame(m) {
                        if tx.send(Frame::data(frame)).await.is_err() {
                            return;
                        }
                    }
                }
                let trailers = cx.receipts.then(|| receipt_trailers(&resp)).flatten();
                let body = resp.into_body().collect().await.map(|b| b.to_bytes());
                if tx.send(Frame::data(event(&body.unwrap_or_default()))).await.is_err() {
                    return;
                }
                if let Some(trailers) = trailers {
                    let _ = tx.send(Frame::trailers(trailers)).await;
                }
                return;
            }
            m = messages.recv(), if open => match m {
                Some(m) => next = Some(m),
                None => open = false,
            },
            _ = tx.closed() => return,
        }
    }
}

/// A body of frames written by a task.
struct FrameBody(mpsc::Receiver<Frame<Bytes>>);

impl http_body::Body for FrameBody {
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|f| f.map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_reaches_only_the_request_of_its_session_and_id_once() {
        let p = PendingAnswers::default();
        let (tx, mut rx) = oneshot::channel();
        let id = Value::from(p.wait("s1", tx).unwrap());
        let ok = Reply::Result(json!({"action": "accept"}));
        assert!(!p.deliver("s2", Some(&id), ok.clone()), "another session");
        assert!(!p.deliver("s1", Some(&json!("carapace-guess")), ok.clone()));
        assert!(!p.deliver("s1", None, ok.clone()));
        assert!(rx.try_recv().is_err());
        assert!(p.deliver("s1", Some(&id), ok.clone()));
        assert_eq!(rx.try_recv().unwrap(), ok);
        assert!(!p.deliver("s1", Some(&id), ok), "answered already");
    }

    #[test]
    fn an_event_is_one_sse_message() {
        assert_eq!(
            &event(br#"{"a":1}"#)[..],
            b"event: message\ndata: {\"a\":1}\n\n"
        );
    }
}
