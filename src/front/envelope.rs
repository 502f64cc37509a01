//! The outermost service of every listener's front: the HTTP stage's refusals in the front's
//! own envelope, and the metrics of every call.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use http::Request;
use tower::Service;

use carapace_filters::Rejection;

use super::{refused, CallRecord, RefusalCode, Resp};
use crate::config::Protocol;
use crate::errors::ToolsV1Answers;
use crate::ops::metrics::Metrics;

/// Turns the HTTP-stage rejections into the front's envelope and records metrics. The
/// outermost service of every listener.
pub struct Envelope<S> {
    inner: S,
    front: Protocol,
    answers: ToolsV1Answers,
    metrics: Arc<Metrics>,
    /// Why the inner stack was not ready, answered to the next call.
    not_ready: Option<Rejection>,
}

impl<S: Clone> Clone for Envelope<S> {
    fn clone(&self) -> Self {
        Envelope {
            inner: self.inner.clone(),
            front: self.front,
            answers: self.answers,
            metrics: self.metrics.clone(),
            // A copy has not been polled ready yet.
            not_ready: None,
        }
    }
}

impl<S> Envelope<S> {
    /// `answers` applies to a tools-v1 front.
    pub fn new(inner: S, front: Protocol, answers: ToolsV1Answers, metrics: Arc<Metrics>) -> Self {
        Envelope {
            inner,
            front,
            answers,
            metrics,
            not_ready: None,
        }
    }
}

/// The front's error envelope for a rejection that happened before a call was decoded.
pub fn rejection_response(front: Protocol, answers: ToolsV1Answers, r: &Rejection) -> Resp {
    match front {
        Protocol::ToolsV1 => crate::tools_v1::error_response(r, ("", ""), 0, answers, false),
        Protocol::SkillV1 => crate::skill_v1::error_response(r),
        Protocol::Mcp => crate::mcp::refusal_response(r),
    }
}

impl<S, B> Service<Request<B>> for Envelope<S>
where
    S: Service<Request<B>, Response = Resp, Error = Rejection>,
{
    type Response = Resp;
    type Error = Infallible;
    type Future = EnvelopeFuture<S::Future>;

    /// Ready when the inner stack is; a stack that refuses readiness is ready too, and the
    /// next call gets the refusal in the front's envelope.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.not_ready = std::task::ready!(self.inner.poll_ready(cx)).err();
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let call = match self.not_ready.take() {
            None => Called::Calling {
                future: self.inner.call(req),
            },
            Some(r) => Called::Refused { refusal: Some(r) },
        };
        EnvelopeFuture {
            call,
            front: self.front,
            answers: self.answers,
            metrics: self.metrics.clone(),
            started: carapace_filters::clock::now(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Envelope`]: the inner stack's, and what the answer's envelope
    /// and metrics need (no box, and the inner future is not moved once started).
    pub struct EnvelopeFuture<F> {
        #[pin]
        call: Called<F>,
        front: Protocol,
        answers: ToolsV1Answers,
        metrics: Arc<Metrics>,
        started: Instant,
    }
}

pin_project_lite::pin_project! {
    /// The inner stack's call, or its refusal of readiness answered instead of one (either,
    /// not both: as large as the larger).
    #[project = CalledProj]
    enum Called<F> {
        Calling { #[pin] future: F },
        Refused { refusal: Option<Rejection> },
    }
}

impl<F> Future for EnvelopeFuture<F>
where
    F: Future<Output = Result<Resp, Rejection>>,
{
    type Output = Result<Resp, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = match this.call.project() {
            CalledProj::Refused { refusal } => Err(refusal
                .take()
                .expect("EnvelopeFuture polled after it answered")),
            CalledProj::Calling { future } => std::task::ready!(future.poll(cx)),
        };
        let (front, answers) = (*this.front, *this.answers);
        let resp = match result {
            Ok(resp) => resp,
            Err(r) => refused(&r, |r| rejection_response(front, answers, r)),
        };
        observe(
            &resp,
            front,
            this.metrics,
            carapace_filters::clock::elapsed(*this.started),
        );
        Poll::Ready(Ok(resp))
    }
}

/// Logs a refused call and records every call in the metrics.
fn observe(resp: &Resp, front: Protocol, metrics: &Metrics, elapsed: Duration) {
    let record = resp.extensions().get::<CallRecord>();
    let outcome = record.map_or("ok", |r| r.outcome);
    let labels = match resp.extensions().get::<RefusalCode>() {
        Some(code) => (code.0, outcome),
        None => (outcome, ""),
    };
    let tool = record
        .and_then(|r| r.tool.as_ref())
        .map(|t| t.name.as_str());
    if !matches!(outcome, "ok" | "app_error") {
        tracing::info!(
            front = %front,
            tool = tool.unwrap_or(""),
            reason = outcome,
            status = resp.status().as_u16(),
            "call refused"
        );
    }
    metrics.observe(front, tool, labels, elapsed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    use crate::front::json_response;

    /// Refuses readiness once, then is ready; counts the calls that reach it.
    #[derive(Clone)]
    struct RefusesOnce {
        refused: Arc<AtomicUsize>,
        calls: Arc<AtomicUsize>,
    }

    impl Service<Request<()>> for RefusesOnce {
        type Response = Resp;
        type Error = Rejection;
        type Future = std::future::Ready<Result<Resp, Rejection>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
            match self.refused.fetch_add(1, Ordering::SeqCst) {
                0 => Poll::Ready(Err(Rejection::Overloaded)),
                _ => Poll::Ready(Ok(())),
            }
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(json_response(StatusCode::OK, &serde_json::json!({}))))
        }
    }

    #[tokio::test]
    async fn a_stack_that_is_not_ready_is_answered_in_the_envelope_and_never_called() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = RefusesOnce {
            refused: Arc::new(AtomicUsize::new(0)),
            calls: calls.clone(),
        };
        let metrics = Arc::new(Metrics::default());
        let answers = ToolsV1Answers::HttpStatus;
        let mut svc = Envelope::new(inner, Protocol::ToolsV1, answers, metrics);
        let mut answer = async || svc.ready().await.unwrap().call(Request::new(())).await;
        let resp = answer().await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "the inner stack was called"
        );
        let resp = answer().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
