//! A scope for every request, entered while the request is handled, so every log line of the
//! call carries its fields (its request id, method, path, tool): a span, or the fields kept
//! beside the call ([`CallScope`]).
//!
//! It is what carapace used of tower-http's `TraceLayer`, without the rest: that layer reads
//! the clock six or more times per request (the start, the response, each body frame, the end
//! of the body) and keeps a clone of the span in the answer's body, for events carapace does
//! not log. Here the clock is read only when `debug` logging is on, for the one
//! `finished processing request` line, as `TraceLayer` wrote it at that level; and only an
//! answer that streams ([`SpannedBody`]) keeps the span until its stream ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::{Layer, Service};

use super::call_fields::CallScope;

/// Runs each request in the scope `make_span` builds for it (a `tracing` span or
/// [`CallFields`](super::call_fields::CallFields)).
///
/// ```
/// use carapace::ops::call_span::CallSpanLayer;
/// use http::Request;
///
/// let layer = CallSpanLayer::new(|req: &Request<()>| {
///     tracing::info_span!("call", path = req.uri().path())
/// });
/// let svc = tower::ServiceBuilder::new().layer(layer).service(tower::service_fn(
///     |_req: Request<()>| async { Ok::<_, std::convert::Infallible>(http::Response::new(())) },
/// ));
/// # let _ = svc;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CallSpanLayer<M> {
    make_span: M,
}

impl<M> CallSpanLayer<M> {
    pub fn new(make_span: M) -> Self {
        CallSpanLayer { make_span }
    }
}

impl<S, M: Clone> Layer<S> for CallSpanLayer<M> {
    type Service = CallSpan<S, M>;
    fn layer(&self, inner: S) -> Self::Service {
        CallSpan {
            inner,
            make_span: self.make_span.clone(),
        }
    }
}

/// Service of [`CallSpanLayer`].
#[derive(Debug, Clone, Copy)]
pub struct CallSpan<S, M> {
    inner: S,
    make_span: M,
}

impl<S, M, B, R, T> Service<Request<B>> for CallSpan<S, M>
where
    S: Service<Request<B>, Response = Response<R>>,
    M: Fn(&Request<B>) -> T,
    T: Into<CallScope>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let mut scope = (self.make_span)(&req).into();
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let inner = scope.in_scope(|| self.inner.call(req));
        ResponseFuture {
            inner,
            scope,
            started,
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`CallSpan`]: the inner future, polled in the call's scope.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        scope: CallScope,
        // When the request came in, if `debug` logging was on then.
        started: Option<Instant>,
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.scope.enter();
        let result = ready!(this.inner.poll(cx));
        if let (Some(started), Ok(res)) = (this.started, &result) {
            tracing::debug!(
                latency = ?started.elapsed(),
                status = res.status().as_u16(),
                "finished processing request"
            );
        }
        Poll::Ready(result)
    }
}

pin_project_lite::pin_project! {
    /// A body that outlives its call's answer (a stream), read in the call's scope: the span
    /// ends when the stream does, and what is logged while it is read carries the call.
    pub struct SpannedBody<B> {
        #[pin]
        inner: B,
        scope: CallScope,
    }
}

impl<B> SpannedBody<B> {
    /// `inner`, read in the current scope (the call's, in a [`CallSpan`]'s inner service).
    pub fn in_current_span(inner: B) -> Self {
        SpannedBody {
            inner,
            scope: CallScope::current(),
        }
    }
}

impl<B: http_body::Body> http_body::Body for SpannedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let _entered = this.scope.enter();
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::call_fields::CallFields;
    use std::sync::{Arc, Mutex};
    use tower::ServiceExt;
    use tracing_subscriber::layer::SubscriberExt;

    /// An event's message and the name of the span it was written in (or `call` for a call
    /// with its fields beside it, followed by its request id).
    type Seen = (String, Option<String>);

    /// Every event with the name of the span it was written in, as a log line shows it.
    #[derive(Clone, Default)]
    struct Events(Arc<Mutex<Vec<Seen>>>);

    impl<S> tracing_subscriber::Layer<S> for Events
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut message = String::new();
            struct Message<'a>(&'a mut String);
            impl tracing::field::Visit for Message<'_> {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        *self.0 = format!("{v:?}");
                    }
                }
            }
            event.record(&mut Message(&mut message));
            let span = match crate::ops::call_fields::current_fields() {
                Some(fields) => {
                    let mut text = String::new();
                    fields.write(&mut text).unwrap();
                    Some(text)
                }
                None => ctx.event_span(event).map(|s| s.name().to_string()),
            };
            self.0.lock().unwrap().push((message, span));
        }
    }

    async fn one_call(level: tracing::level_filters::LevelFilter) -> Vec<Seen> {
        one_call_in(level, |req: &Request<()>| {
            tracing::info_span!("call", path = req.uri().path()).into()
        })
        .await
    }

    async fn one_call_in(
        level: tracing::level_filters::LevelFilter,
        scope: fn(&Request<()>) -> CallScope,
    ) -> Vec<Seen> {
        let events = Events::default();
        let subscriber = tracing_subscriber::registry()
            .with(level)
            .with(events.clone());
        let _default = tracing::subscriber::set_default(subscriber);
        let svc = CallSpanLayer::new(scope).layer(tower::service_fn(|_req: Request<()>| async {
            tracing::info!("in the app");
            tokio::task::yield_now().await;
            tracing::info!("still in the app");
            Ok::<_, std::convert::Infallible>(Response::builder().status(201).body(()).unwrap())
        }));
        let res = svc
            .oneshot(Request::get("/v1/tools").body(()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let seen = events.0.lock().unwrap().clone();
        seen
    }

    #[tokio::test]
    async fn every_line_of_the_call_is_written_in_its_span() {
        let seen = one_call(tracing::level_filters::LevelFilter::INFO).await;
        let call = Some("call".to_string());
        assert_eq!(
            seen,
            vec![
                ("in the app".to_string(), call.clone()),
                ("still in the app".to_string(), call),
            ]
        );
    }

    fn fields_beside(req: &Request<()>) -> CallScope {
        CallScope::Fields(Arc::new(CallFields::new(
            http::HeaderValue::from_static("id-1"),
            req.method().clone(),
            req.uri().clone(),
        )))
    }

    #[tokio::test]
    async fn every_line_of_a_call_with_its_fields_beside_it_carries_them() {
        let seen = one_call_in(tracing::level_filters::LevelFilter::DEBUG, fields_beside).await;
        let call = Some(r#"call{request_id="id-1" method="GET" path="/v1/tools"}"#.to_string());
        let messages = [
            "in the app",
            "still in the app",
            "finished processing request",
        ];
        assert_eq!(
            seen,
            messages.map(|m| (m.to_string(), call.clone())).to_vec()
        );
        assert!(crate::ops::call_fields::current_fields().is_none());
    }

    #[tokio::test]
    async fn the_end_of_a_call_is_logged_at_debug_only() {
        let seen = one_call(tracing::level_filters::LevelFilter::DEBUG).await;
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2].0, "finished processing request");
        assert_eq!(seen[2].1.as_deref(), Some("call"));
    }

    /// What a streamed body made in the scope `scope` makes logs while it is read (outside
    /// the scope, as hyper reads an answer's body).
    async fn streamed_in(scope: impl FnOnce() -> CallScope) -> Vec<Seen> {
        use http_body_util::BodyExt;
        let events = Events::default();
        let subscriber = tracing_subscriber::registry()
            .with(tracing::level_filters::LevelFilter::INFO)
            .with(events.clone());
        let _default = tracing::subscriber::set_default(subscriber);
        let stream = futures_util::stream::poll_fn(|_| {
            tracing::info!("a frame");
            Poll::Ready(None::<Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>>)
        });
        let body = scope()
            .in_scope(|| SpannedBody::in_current_span(http_body_util::StreamBody::new(stream)));
        assert!(body.collect().await.unwrap().to_bytes().is_empty());
        let seen = events.0.lock().unwrap().clone();
        seen
    }

    #[tokio::test]
    async fn a_streamed_body_is_read_in_the_scope_it_was_made_in() {
        let seen = streamed_in(|| tracing::info_span!("call").into()).await;
        assert_eq!(
            seen,
            vec![("a frame".to_string(), Some("call".to_string()))]
        );
        let req = Request::post("/mcp").body(()).unwrap();
        let seen = streamed_in(|| fields_beside(&req)).await;
        let call = r#"call{request_id="id-1" method="POST" path="/mcp"}"#;
        assert_eq!(seen, vec![("a frame".to_string(), Some(call.to_string()))]);
    }
}
