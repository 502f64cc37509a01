//! The generic HTTP edge of every caller listener, from tower-http, around the protocol
//! stack: sensitive headers marked before anything can log them, a request id for every
//! request, a span per request that every log line of the call is written in, and a panic in
//! one call answered as `INTERNAL` in the front's own envelope while the process and the
//! connection carry on.
//!
//! ```text
//! CatchPanic -> SetSensitiveHeaders -> (drop a malformed x-request-id) -> SetRequestId
//!   -> PropagateRequestId -> CallSpan -> (a streamed body put in place) -> the front's stack
//! ```
//!
//! A front answers with a whole body; one that streams its answer (the MCP front's SSE) puts
//! the stream in the answer's [`StreamedBody`] extension, and the edge sends that instead.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;

use crate::caller_body::CallerBody;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder};
use tower_http::catch_panic::{CatchPanicLayer, ResponseForPanic};
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::sensitive_headers::SetSensitiveHeadersLayer;

use carapace_filters::call::REQUEST_ID;
use carapace_filters::Rejection;

use crate::config::Protocol;
use crate::errors::ToolsV1Answers;
use crate::front::Resp;
use crate::ops::call_span::{CallSpanLayer, SpannedBody};

/// The body of every answer to a caller.
pub type EdgeBody = tower_http::body::UnsyncBoxBody<Bytes, tower_http::BoxError>;

/// A listener's whole stack, edge included.
pub type HttpStack = BoxCloneSyncService<Request<CallerBody>, Response<EdgeBody>, Infallible>;

/// Headers whose values never appear in a log line or a trace (`Sensitive` instead).
pub static SENSITIVE_HEADERS: [HeaderName; 6] = [
    http::header::AUTHORIZATION,
    http::header::PROXY_AUTHORIZATION,
    http::header::COOKIE,
    http::header::SET_COOKIE,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("x-skill-signature"),
];

/// The body of an answer that streams, carried to the edge in the answer's extensions (the
/// stacks between front and edge see only the head).
#[derive(Clone)]
pub struct StreamedBody(Arc<Mutex<Option<StreamBody>>>);

/// A body that streams, as a front makes it.
pub type StreamBody = http_body_util::combinators::UnsyncBoxBody<Bytes, tower_http::BoxError>;

impl StreamedBody {
    pub fn new(body: StreamBody) -> Self {
        StreamedBody(Arc::new(Mutex::new(Some(body))))
    }
}

/// The answer's body: its streamed body when it has one.
fn streamed(resp: Resp) -> Response<StreamBody> {
    let (mut head, body) = resp.into_parts();
    let stream = head
        .extensions
        .remove::<StreamedBody>()
        .and_then(|s| s.0.lock().unwrap_or_else(|e| e.into_inner()).take());
    let body = match stream {
        // A stream outlives the answer: it is read in the call's span, which lasts until it
        // ends (this runs inside the call's span).
        Some(stream) => SpannedBody::in_current_span(stream).boxed_unsync(),
        None => body.map_err(|never| match never {}).boxed_unsync(),
    };
    Response::from_parts(head, body)
}

/// Longest request id taken from a caller.
const MAX_REQUEST_ID: usize = 128;

/// Makes a request id for a request that came without a usable one: 16 random bytes, hex.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        let mut id = [0u8; 32];
        hex::encode_to_slice(rand::random::<[u8; 16]>(), &mut id).expect("32 hex digits");
        HeaderValue::from_bytes(&id).ok().map(RequestId::new)
    }
}

/// Whether a caller's request id is kept: 1 to 128 characters of `A-Z a-z 0-9 . _ : -`, so it
/// can go into log lines and on to the app as it is.
pub fn is_usable_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_REQUEST_ID
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// A caller's request id is kept only when usable and single; otherwise carapace makes one.
fn drop_unusable_request_id(mut req: Request<CallerBody>) -> Request<CallerBody> {
    let values = req.headers().get_all(REQUEST_ID);
    let mut it = values.iter();
    let keep = matches!((it.next(), it.next()), (Some(v), None) if is_usable_request_id(v));
    if !keep {
        req.headers_mut().remove(REQUEST_ID);
    }
    req
}

/// Answers a call that panicked: `INTERNAL` in the front's envelope (the panic's text stays
/// in the log).
#[derive(Clone, Copy, Debug)]
pub struct PanicAnswer {
    pub front: Protocol,
    pub answers: ToolsV1Answers,
}

impl ResponseForPanic for PanicAnswer {
    type ResponseBody = http_body_util::Full<Bytes>;

    fn response_for_panic(
        &mut self,
        err: Box<dyn std::any::Any + Send + 'static>,
    ) -> Response<Self::ResponseBody> {
        let what = err
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| err.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(panic = %what, "a call panicked; answered INTERNAL");
        let r = Rejection::Internal("a call panicked".into());
        let resp: Resp = crate::front::rejection_response(self.front, self.answers, &r);
        resp
    }
}

/// Wrap a front's stack in the edge.
pub fn edge<S>(inner: S, panic: PanicAnswer) -> HttpStack
where
    S: Service<Request<CallerBody>, Response = Resp, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let svc = ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(panic))
        .layer(SetSensitiveHeadersLayer::new(
            SENSITIVE_HEADERS.iter().cloned(),
        ))
        .map_request(drop_unusable_request_id)
        .layer(SetRequestIdLayer::new(REQUEST_ID, RandomRequestId))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(CallSpanLayer::new(|req: &Request<CallerBody>| {
            let id = req
                .headers()
                .get(REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let span = tracing::info_span!(
                "call",
                request_id = id,
                // A `str`, not `Display`: formatted without the `fmt` machinery.
                method = req.method().as_str(),
                path = req.uri().path(),
                tool = tracing::field::Empty,
                context_trace_id = tracing::field::Empty,
            );
            crate::telemetry::adopt_caller_context(&span, req.headers());
            span
        }))
        .map_response(streamed)
        .service(inner);
    BoxCloneSyncService::new(svc)
}

/// The request id a front puts on its call.
pub fn request_id<B>(req: &Request<B>) -> Option<HeaderValue> {
    req.extensions()
        .get::<RequestId>()
        .map(|id| id.header_value().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_bounded_request_ids_are_taken_from_callers() {
        for ok in ["a", "req-1", "01JXYZ.abc:9_x", &"a".repeat(128)] {
            assert!(
                is_usable_request_id(&HeaderValue::from_str(ok).unwrap()),
                "{ok}"
            );
        }
        for bad in ["", "a b", "a\tb", "ü", "x/y", "<script>", &"a".repeat(129)] {
            let v = HeaderValue::from_bytes(bad.as_bytes()).unwrap();
            assert!(!is_usable_request_id(&v), "{bad}");
        }
    }
}
