//! The generic HTTP edge of every caller listener around the protocol stack, in layers of its
//! own (what tower-http's would do): sensitive headers marked before anything can log them, a
//! request id for every request, a scope per request that every log line of the call is
//! written in, and a panic in one call answered as `INTERNAL` in the front's own envelope
//! while the process and the connection carry on.
//!
//! ```text
//! CatchPanic -> SensitiveHeaders -> RequestIds -> CallSpan -> (a streamed body put in place)
//!   -> the front's stack
//! ```
//!
//! Answers go out as an [`EdgeBody`], not boxed: a front answers with a whole body; one that
//! streams its answer (the MCP front's SSE) puts the stream in the answer's [`StreamedBody`]
//! extension, and the edge sends that instead.

mod body;
mod catch_panic;
pub mod request_id;
pub mod sensitive_headers;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;

use crate::caller_body::CallerBody;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder};

use crate::front::Resp;
use crate::ops::call_fields::{self, CallFields, CallScope};
use crate::ops::call_span::{CallSpanLayer, SpannedBody};
pub use request_id::request_id;
use request_id::RequestIdLayer;
use sensitive_headers::SensitiveHeadersLayer;

pub use body::EdgeBody;
pub use catch_panic::{CatchPanic, CatchPanicFuture, CatchPanicLayer, PanicAnswer};

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
pub type StreamBody = http_body_util::combinators::UnsyncBoxBody<Bytes, tower::BoxError>;

impl StreamedBody {
    pub fn new(body: StreamBody) -> Self {
        StreamedBody(Arc::new(Mutex::new(Some(body))))
    }
}

/// The answer's body: its streamed body when it has one.
fn streamed(resp: Resp) -> Response<EdgeBody> {
    let (mut head, body) = resp.into_parts();
    let stream = head
        .extensions
        .remove::<StreamedBody>()
        .and_then(|s| s.0.lock().unwrap_or_else(|e| e.into_inner()).take());
    let body = match stream {
        // A stream outlives the answer: it is read in the call's span, which lasts until it
        // ends (this runs inside the call's span).
        Some(stream) => EdgeBody::Streamed(SpannedBody::in_current_span(stream).boxed_unsync()),
        None => EdgeBody::Whole(body),
    };
    Response::from_parts(head, body)
}

/// [`SENSITIVE_HEADERS`], and `credential_header` when it is not among them.
fn sensitive_names(credential_header: Option<HeaderName>) -> Arc<[HeaderName]> {
    let extra = credential_header.filter(|h| !SENSITIVE_HEADERS.contains(h));
    SENSITIVE_HEADERS.iter().cloned().chain(extra).collect()
}

/// The scope a request is handled in: its fields beside it when `beside` (made only when
/// `info` is enabled, as the span would be), else the `call` span.
fn call_scope<B>(req: &Request<B>, beside: bool) -> CallScope {
    let id = req.extensions().get::<request_id::RequestId>();
    if beside {
        if !tracing::enabled!(tracing::Level::INFO) {
            return CallScope::Span(tracing::Span::none());
        }
        return CallScope::Fields(Arc::new(CallFields::new(
            id.map_or(HeaderValue::from_static(""), |id| id.0.clone()),
            req.method().clone(),
            req.uri().clone(),
        )));
    }
    let id = id.and_then(|v| v.0.to_str().ok()).unwrap_or("");
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
    CallScope::Span(span)
}

/// Wrap a front's stack in the edge.
///
/// `credential_header`: the header a front's callers send a credential in when it is not one
/// of [`SENSITIVE_HEADERS`] (a configured `front.auth.header_name`), marked sensitive too.
pub fn edge<S>(inner: S, panic: PanicAnswer, credential_header: Option<HeaderName>) -> HttpStack
where
    S: Service<Request<CallerBody>, Response = Resp, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let svc = ServiceBuilder::new()
        .layer(CatchPanicLayer::new(panic))
        .layer(SensitiveHeadersLayer::new(sensitive_names(
            credential_header,
        )))
        .layer(RequestIdLayer)
        .layer(CallSpanLayer::new(|req: &Request<CallerBody>| {
            call_scope(req, call_fields::fields_beside_calls())
        }))
        .map_response(streamed)
        .service(inner);
    BoxCloneSyncService::new(svc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::level_filters::LevelFilter;

    /// The scope a request gets under a subscriber logging at `level`; its call's text.
    fn scope_at(level: LevelFilter, beside: bool) -> (CallScope, Option<String>) {
        let subscriber =
            tracing_subscriber::layer::SubscriberExt::with(tracing_subscriber::registry(), level);
        tracing::subscriber::with_default(subscriber, || {
            let mut req = Request::post("/v1/tools/call").body(()).unwrap();
            req.extensions_mut()
                .insert(request_id::RequestId(HeaderValue::from_static("id-7")));
            let mut scope = call_scope(&req, beside);
            let text = scope.in_scope(call_fields::current_fields).map(|f| {
                let mut text = String::new();
                f.write(&mut text).unwrap();
                text
            });
            (scope, text)
        })
    }

    #[test]
    fn a_call_keeps_its_fields_beside_it_only_when_asked_and_info_is_on() {
        let (scope, text) = scope_at(LevelFilter::INFO, true);
        assert!(matches!(scope, CallScope::Fields(_)));
        assert_eq!(
            text.as_deref(),
            Some(r#"call{request_id="id-7" method="POST" path="/v1/tools/call"}"#)
        );
        // As the `info` span would be: nothing when the level is above it.
        let (scope, text) = scope_at(LevelFilter::WARN, true);
        assert!(
            matches!(&scope, CallScope::Span(s) if s.is_none()),
            "{scope:?}"
        );
        assert_eq!(text, None);
        let (scope, text) = scope_at(LevelFilter::INFO, false);
        assert!(
            matches!(&scope, CallScope::Span(s) if s.metadata().is_some_and(|m| m.name() == "call")),
            "{scope:?}"
        );
        assert_eq!(text, None);
    }

    #[test]
    fn a_configured_credential_header_is_sensitive_too_and_listed_once() {
        let custom = HeaderName::from_static("x-tool-key");
        let names = sensitive_names(Some(custom.clone()));
        assert_eq!(names.len(), SENSITIVE_HEADERS.len() + 1);
        assert!(names.contains(&custom));
        assert!(SENSITIVE_HEADERS.iter().all(|h| names.contains(h)));
        let names = sensitive_names(Some(HeaderName::from_static("x-api-key")));
        assert_eq!(&*names, &SENSITIVE_HEADERS[..]);
        assert_eq!(&*sensitive_names(None), &SENSITIVE_HEADERS[..]);
    }
}
