//! Per-call timeout: the call's `timeout_ms` (or the tool's default) clamped to the tool's
//! `timeout_ms_max`. When it elapses the inner future (and with it the upstream request) is
//! dropped, a hard stop, and the call fails with `Timeout`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::{Layer, Service};

use crate::call::ToolCall;
use crate::Rejection;

/// Applies each call's clamped timeout.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallTimeoutLayer;

impl<S> Layer<S> for CallTimeoutLayer {
    type Service = CallTimeout<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CallTimeout { inner }
    }
}

/// Service of [`CallTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct CallTimeout<S> {
    inner: S,
}

impl<S> Service<ToolCall> for CallTimeout<S>
where
    S: Service<ToolCall, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = CallTimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let limit = call.tool.effective_timeout(call.timeout_ms);
        CallTimeoutFuture {
            inner: self.inner.call(call),
            // From the poll's clock reading (see `clock`): the call was started in it.
            sleep: match crate::clock::now().checked_add(limit) {
                Some(deadline) => tokio::time::sleep_until(deadline),
                None => tokio::time::sleep(limit),
            },
            limit_ms: limit.as_millis() as u64,
        }
    }
}

pin_project! {
    /// Response future of [`CallTimeout`].
    pub struct CallTimeoutFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: Sleep,
        limit_ms: u64,
    }
}

impl<F, T> Future for CallTimeoutFuture<F>
where
    F: Future<Output = Result<T, Rejection>>,
{
    type Output = Result<T, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.inner.poll(cx) {
            return Poll::Ready(out);
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Rejection::Timeout(*this.limit_ms))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::testing::{call, tool};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tower::ServiceExt;

    struct DropFlag(Arc<AtomicBool>);
    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A backend that takes `work` and records whether its future was dropped unfinished.
    fn slow(
        work: Duration,
        dropped: Arc<AtomicBool>,
    ) -> impl Service<ToolCall, Response = (), Error = Rejection, Future = impl Send> + Clone {
        tower::service_fn(move |_: ToolCall| {
            let flag = DropFlag(dropped.clone());
            async move {
                tokio::time::sleep(work).await;
                std::mem::forget(flag);
                Ok(())
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn requested_timeout_is_clamped_to_the_tool_max_and_the_call_dropped() {
        let dropped = Arc::new(AtomicBool::new(false));
        let svc = CallTimeoutLayer.layer(slow(Duration::from_secs(60), dropped.clone()));
        let start = tokio::time::Instant::now();
        let err = svc
            .oneshot(call(tool("t", 1_000, 2_000), Some(30_000)))
            .await
            .unwrap_err();
        assert!(matches!(err, Rejection::Timeout(2_000)), "{err:?}");
        assert_eq!(start.elapsed(), Duration::from_millis(2_000));
        assert!(
            dropped.load(Ordering::SeqCst),
            "upstream future was not dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn default_applies_without_a_request_and_fast_calls_pass() {
        let dropped = Arc::new(AtomicBool::new(false));
        let svc = CallTimeoutLayer.layer(slow(Duration::from_millis(500), dropped.clone()));
        let err = svc
            .clone()
            .oneshot(call(tool("t", 100, 2_000), None))
            .await
            .unwrap_err();
        assert!(matches!(err, Rejection::Timeout(100)));
        svc.oneshot(call(tool("t", 100, 2_000), Some(1_000)))
            .await
            .unwrap();
    }
}
