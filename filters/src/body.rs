//! Body size limit and body deadline. A declared `Content-Length` over the limit is refused
//! before a byte of the body is read; otherwise the body is collected under the limit and a
//! deadline (against slow uploads) and handed on as `Bytes`.

use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::task::{Context, Poll};
use tower::{Layer, Service};

use crate::{BoxFuture, Rejection};

/// Limits of [`BodyLimitLayer`].
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body accepted, in bytes.
    pub max_bytes: u64,
    /// Longest time the whole body may take to arrive.
    pub deadline: Duration,
}

/// Collects the request body under [`BodyLimits`].
#[derive(Debug, Clone, Copy)]
pub struct BodyLimitLayer {
    limits: BodyLimits,
}

impl BodyLimitLayer {
    pub fn new(limits: BodyLimits) -> Self {
        BodyLimitLayer { limits }
    }
}

impl<S> Layer<S> for BodyLimitLayer {
    type Service = BodyLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        BodyLimit {
            inner,
            limits: self.limits,
        }
    }
}

/// Service of [`BodyLimitLayer`].
#[derive(Debug, Clone)]
pub struct BodyLimit<S> {
    inner: S,
    limits: BodyLimits,
}

impl<S, B> Service<http::Request<B>> for BodyLimit<S>
where
    S: Service<http::Request<Bytes>, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = BoxFuture<Result<S::Response, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let limits = self.limits;
        // Take the service that was driven to readiness; leave a clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            if let Some(declared) = content_length(&req) {
                if declared > limits.max_bytes {
                    return Err(Rejection::PayloadTooLarge {
                        limit: limits.max_bytes,
                    });
                }
            }
            let (parts, body) = req.into_parts();
            let limited = Limited::new(body, limits.max_bytes as usize);
            let bytes = match tokio::time::timeout(limits.deadline, limited.collect()).await {
                Err(_) => return Err(Rejection::BodyTimeout(limits.deadline)),
                Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return Err(Rejection::PayloadTooLarge {
                        limit: limits.max_bytes,
                    })
                }
                Ok(Err(e)) => return Err(Rejection::invalid(format!("reading body: {e}"))),
                Ok(Ok(collected)) => collected.to_bytes(),
            };
            inner.call(http::Request::from_parts(parts, bytes)).await
        })
    }
}

fn content_length<B>(req: &http::Request<B>) -> Option<u64> {
    req.headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;

    fn echo_len(
        seen: Arc<AtomicUsize>,
    ) -> impl Service<http::Request<Bytes>, Response = usize, Error = Rejection, Future = impl Send>
           + Clone {
        tower::service_fn(move |req: http::Request<Bytes>| {
            seen.fetch_add(1, Ordering::SeqCst);
            let n = req.body().len();
            async move { Ok::<_, Rejection>(n) }
        })
    }

    const LIMITS: BodyLimits = BodyLimits {
        max_bytes: 8,
        deadline: Duration::from_secs(5),
    };

    #[tokio::test]
    async fn declared_length_over_limit_is_refused_unread() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_len(seen.clone()));
        // A body stream that would panic if polled: the check must happen before reading.
        let body = StreamBody::new(futures_never());
        let req = http::Request::builder()
            .header("content-length", "9")
            .body(body)
            .unwrap();
        let err = svc.oneshot(req).await.unwrap_err();
        assert!(matches!(err, Rejection::PayloadTooLarge { limit: 8 }));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn undeclared_body_over_limit_is_refused() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_len(seen.clone()));
        let req = http::Request::new(Full::new(Bytes::from_static(b"123456789")));
        let err = svc.oneshot(req).await.unwrap_err();
        assert!(matches!(err, Rejection::PayloadTooLarge { .. }));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn within_limit_passes_the_bytes_on() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_len(seen.clone()));
        let req = http::Request::new(Full::new(Bytes::from_static(b"12345678")));
        assert_eq!(svc.oneshot(req).await.unwrap(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_body_hits_the_deadline() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_len(seen.clone()));
        let req = http::Request::new(StreamBody::new(futures_never()));
        let err = svc.oneshot(req).await.unwrap_err();
        assert!(matches!(err, Rejection::BodyTimeout(d) if d == LIMITS.deadline));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }

    /// A body stream that never yields.
    fn futures_never(
    ) -> impl futures_core::Stream<Item = Result<http_body::Frame<Bytes>, std::io::Error>> + Send
    {
        struct Never;
        impl futures_core::Stream for Never {
            type Item = Result<http_body::Frame<Bytes>, std::io::Error>;
            fn poll_next(
                self: std::pin::Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Self::Item>> {
                Poll::Pending
            }
        }
        Never
    }
}
