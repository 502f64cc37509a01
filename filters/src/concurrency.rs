//! Concurrency limit that sheds load: when the limit is reached a request is refused at once
//! (503 `Overloaded`) instead of waiting in an unbounded queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::future::ReadyOr;
use crate::Rejection;

/// At most `max` requests in flight through the wrapped service.
#[derive(Debug, Clone)]
pub struct LoadShedLayer {
    permits: Arc<Semaphore>,
}

impl LoadShedLayer {
    pub fn new(max: usize) -> Self {
        LoadShedLayer {
            permits: Arc::new(Semaphore::new(max)),
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;
    fn layer(&self, inner: S) -> Self::Service {
        LoadShed {
            inner,
            permits: self.permits.clone(),
        }
    }
}

/// Service of [`LoadShedLayer`].
#[derive(Debug, Clone)]
pub struct LoadShed<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

impl<S, R> Service<R> for LoadShed<S>
where
    S: Service<R, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = LoadShedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => LoadShedFuture {
                inner: ReadyOr::inner(self.inner.call(req)),
                permit: Some(permit),
            },
            Err(_) => LoadShedFuture {
                inner: ReadyOr::reject(Rejection::Overloaded),
                permit: None,
            },
        }
    }
}

pin_project! {
    /// Holds the permit until the inner response is ready.
    pub struct LoadShedFuture<F> {
        #[pin]
        inner: ReadyOr<F>,
        permit: Option<OwnedSemaphorePermit>,
    }
}

impl<F, T> Future for LoadShedFuture<F>
where
    F: Future<Output = Result<T, Rejection>>,
{
    type Output = Result<T, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        this.permit.take();
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn sheds_beyond_the_limit_and_recovers() {
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        let svc = tower::service_fn(move |_: ()| {
            let mut rx = release_rx.clone();
            async move {
                rx.wait_for(|v| *v).await.ok();
                Ok::<_, Rejection>(())
            }
        });
        let svc = LoadShedLayer::new(1).layer(svc);
        // The first call takes the only permit when it is called (not when polled).
        let mut first_svc = svc.clone();
        let first = first_svc.call(());
        let first = tokio::spawn(first);
        let err = svc.clone().oneshot(()).await.unwrap_err();
        assert!(matches!(err, Rejection::Overloaded), "{err:?}");
        release_tx.send(true).unwrap();
        first.await.unwrap().unwrap();
        svc.oneshot(()).await.unwrap();
    }
}
