//! A panic in one call, while it is started or while it runs, answered as `INTERNAL` in the
//! front's own envelope; the process and the connection carry on. The answer's body type is
//! kept (tower-http's layer boxes every answer's body to add its own).

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use carapace_filters::Rejection;

use super::body::EdgeBody;
use crate::config::Protocol;
use crate::errors::ToolsV1Answers;

/// Answers a call that panicked: `INTERNAL` in the front's envelope (the panic's text stays
/// in the log).
#[derive(Clone, Copy, Debug)]
pub struct PanicAnswer {
    pub front: Protocol,
    pub answers: ToolsV1Answers,
}

impl PanicAnswer {
    fn answer(&self, panic: Box<dyn Any + Send>) -> Response<EdgeBody> {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(panic = %what, "a call panicked; answered INTERNAL");
        let r = Rejection::Internal("a call panicked".into());
        crate::front::rejection_response(self.front, self.answers, &r).map(EdgeBody::Whole)
    }
}

/// Layer of [`CatchPanic`].
///
/// ```
/// use carapace::config::Protocol;
/// use carapace::edge::{CatchPanicLayer, EdgeBody, PanicAnswer};
/// use http::{Request, Response};
/// use tower::{Layer, Service, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let answer = PanicAnswer { front: Protocol::SkillV1, answers: Default::default() };
/// let svc = CatchPanicLayer::new(answer).layer(tower::service_fn(|_: Request<()>| async {
///     panic!("a bug");
///     #[allow(unreachable_code)]
///     Ok::<Response<EdgeBody>, std::convert::Infallible>(unreachable!())
/// }));
/// let resp = svc.oneshot(Request::new(())).await.unwrap();
/// assert_eq!(resp.status(), 500);
/// # });
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CatchPanicLayer {
    answer: PanicAnswer,
}

impl CatchPanicLayer {
    pub fn new(answer: PanicAnswer) -> Self {
        CatchPanicLayer { answer }
    }
}

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;
    fn layer(&self, inner: S) -> CatchPanic<S> {
        CatchPanic {
            inner,
            answer: self.answer,
        }
    }
}

/// Catches a panic of the inner service's `call` or of its future, and answers it.
#[derive(Clone, Debug)]
pub struct CatchPanic<S> {
    inner: S,
    answer: PanicAnswer,
}

impl<S, B> Service<Request<B>> for CatchPanic<S>
where
    S: Service<Request<B>, Response = Response<EdgeBody>, Error = Infallible>,
{
    type Response = Response<EdgeBody>;
    type Error = Infallible;
    type Future = CatchPanicFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(future) => CatchPanicFuture::Calling {
                future,
                answer: self.answer,
            },
            Err(panic) => CatchPanicFuture::Answered {
                answered: Some(self.answer.answer(panic)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`CatchPanic`]: the inner call's, or the answer to a panic in
    /// `call` (either, not both: the future is as large as the larger).
    #[project = CatchPanicProj]
    pub enum CatchPanicFuture<F> {
        Calling {
            #[pin]
            future: F,
            answer: PanicAnswer,
        },
        Answered {
            answered: Option<Response<EdgeBody>>,
        },
    }
}

impl<F> Future for CatchPanicFuture<F>
where
    F: Future<Output = Result<Response<EdgeBody>, Infallible>>,
{
    type Output = Result<Response<EdgeBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CatchPanicProj::Answered { answered } => Poll::Ready(Ok(answered
                .take()
                .expect("CatchPanicFuture polled after it answered"))),
            CatchPanicProj::Calling { future, answer } => {
                match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(poll) => poll,
                    Err(panic) => Poll::Ready(Ok(answer.answer(panic))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;

    /// Panics in its `call` on the first request, in its future on the second, and answers
    /// `ok` after that.
    #[derive(Clone, Default)]
    struct Flaky(Arc<AtomicUsize>);

    impl Service<Request<()>> for Flaky {
        type Response = Response<EdgeBody>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Response<EdgeBody>, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            assert!(n != 0, "secret-in-call");
            Box::pin(async move {
                tokio::task::yield_now().await;
                assert!(n != 1, "secret-in-future");
                let body = EdgeBody::Whole(Full::new(Bytes::from_static(b"ok")));
                Ok(Response::new(body))
            })
        }
    }

    async fn text(resp: Response<EdgeBody>) -> (u16, String) {
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_panic_in_call_or_in_its_future_is_answered_internal_and_the_next_call_is_served() {
        let answer = PanicAnswer {
            front: Protocol::ToolsV1,
            answers: ToolsV1Answers::default(),
        };
        let mut svc = CatchPanicLayer::new(answer).layer(Flaky::default());
        for _ in 0..2 {
            let resp = svc.ready().await.unwrap().call(Request::new(())).await;
            let (_, body) = text(resp.unwrap()).await;
            assert!(body.contains(r#""code":"INTERNAL""#), "{body}");
            assert!(
                !body.contains("secret"),
                "the panic's text stays in the log: {body}"
            );
        }
        let resp = svc.ready().await.unwrap().call(Request::new(())).await;
        assert_eq!(text(resp.unwrap()).await, (200, "ok".to_string()));
    }
}
