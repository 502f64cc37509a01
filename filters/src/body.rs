//! Body size limit and body deadline. A declared `Content-Length` over the limit is refused
//! before a byte of the body is read; otherwise the body is collected under the limit and a
//! deadline (against slow uploads) and handed on as `Bytes`.
//!
//! The deadline's timer is set only when the body is found waiting: a body that is already
//! whole when the request is handled (a small call's, read with its head) takes no timer, and
//! a body of one frame is handed on without a copy.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::{Layer, Service};

use crate::Rejection;

/// Limits of [`BodyLimitLayer`].
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body accepted, in bytes.
    pub max_bytes: u64,
    /// Longest time the whole body may take to arrive.
    pub deadline: Duration,
}

/// Collects the request body under [`BodyLimits`].
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use carapace_filters::body::{BodyLimitLayer, BodyLimits};
/// use carapace_filters::Rejection;
/// use http_body_util::Full;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limits = BodyLimits { max_bytes: 4, deadline: Duration::from_secs(5) };
/// let app = service_fn(|req: http::Request<Bytes>| async move {
///     Ok::<_, Rejection>(req.into_body().len())
/// });
/// let svc = BodyLimitLayer::new(limits).layer(app);
/// let small = http::Request::new(Full::new(Bytes::from_static(b"1234")));
/// assert_eq!(svc.clone().oneshot(small).await.unwrap(), 4);
/// let large = http::Request::new(Full::new(Bytes::from_static(b"12345")));
/// let refused = svc.oneshot(large).await.unwrap_err();
/// assert!(matches!(refused, Rejection::PayloadTooLarge { limit: 4 }));
/// # });
/// ```
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
    S: Service<http::Request<Bytes>, Error = Rejection> + Clone,
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = BodyLimitFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let limits = self.limits;
        if content_length(&req).is_some_and(|declared| declared > limits.max_bytes) {
            return BodyLimitFuture::Refused {
                rejection: Some(Rejection::PayloadTooLarge {
                    limit: limits.max_bytes,
                }),
            };
        }
        // Take the service that was driven to readiness; leave a clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        BodyLimitFuture::Collecting {
            body,
            rest: Some(Box::new(Collecting {
                parts,
                inner,
                limits,
                bytes: Collected::Empty,
                deadline: None,
            })),
        }
    }
}

/// What a body's collection keeps beside the body (boxed: the future is small whichever
/// state it is in).
struct Collecting<S> {
    parts: http::request::Parts,
    inner: S,
    limits: BodyLimits,
    bytes: Collected,
    /// Set when the body was first found waiting.
    deadline: Option<Pin<Box<Sleep>>>,
}

/// The body's bytes so far: one frame's are kept as they came.
enum Collected {
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Collected {
    fn len(&self) -> usize {
        match self {
            Collected::Empty => 0,
            Collected::One(b) => b.len(),
            Collected::Many(b) => b.len(),
        }
    }

    fn push(&mut self, mut data: impl Buf) {
        *self = match std::mem::replace(self, Collected::Empty) {
            Collected::Empty => Collected::One(data.copy_to_bytes(data.remaining())),
            Collected::One(first) => {
                let mut many = BytesMut::with_capacity(first.len() + data.remaining());
                many.extend_from_slice(&first);
                many.put(data);
                Collected::Many(many)
            }
            Collected::Many(mut many) => {
                many.put(data);
                Collected::Many(many)
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Collected::Empty => Bytes::new(),
            Collected::One(b) => b,
            Collected::Many(b) => b.freeze(),
        }
    }
}

pin_project! {
    /// Response future of [`BodyLimit`]: the body collected, then the inner service's call.
    #[project = BodyLimitProj]
    pub enum BodyLimitFuture<S, B>
    where
        S: Service<http::Request<Bytes>>,
    {
        Collecting {
            #[pin]
            body: B,
            rest: Option<Box<Collecting<S>>>,
        },
        Calling {
            #[pin]
            future: S::Future,
        },
        Refused {
            rejection: Option<Rejection>,
        },
    }
}

impl<S, B> Future for BodyLimitFuture<S, B>
where
    S: Service<http::Request<Bytes>, Error = Rejection>,
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = Result<S::Response, Rejection>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let call = match self.as_mut().project() {
                BodyLimitProj::Calling { future } => return future.poll(cx),
                BodyLimitProj::Refused { rejection } => {
                    return Poll::Ready(Err(rejection.take().expect("polled after completion")))
                }
                BodyLimitProj::Collecting { body, rest } => {
                    let c = rest.as_mut().expect("polled after completion");
                    ready!(collect(body, c, cx))?;
                    let Collecting {
                        parts,
                        mut inner,
                        bytes,
                        ..
                    } = *rest.take().expect("checked above");
                    inner.call(http::Request::from_parts(parts, bytes.into_bytes()))
                }
            };
            self.set(BodyLimitFuture::Calling { future: call });
        }
    }
}

/// Read `body`'s frames into `c` until it ends, its limit is passed, or it waits past the
/// deadline (the timer set when it first waits).
fn collect<S, B>(
    mut body: Pin<&mut B>,
    c: &mut Collecting<S>,
    cx: &mut Context<'_>,
) -> Poll<Result<(), Rejection>>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limits = c.limits;
    loop {
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(None) => return Poll::Ready(Ok(())),
            Poll::Ready(Some(Err(e))) => {
                let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                return Poll::Ready(Err(Rejection::invalid(format!("reading body: {e}"))));
            }
            Poll::Ready(Some(Ok(frame))) => {
                // Trailers are not passed on.
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if (c.bytes.len() + data.remaining()) as u64 > limits.max_bytes {
                    return Poll::Ready(Err(Rejection::PayloadTooLarge {
                        limit: limits.max_bytes,
                    }));
                }
                c.bytes.push(data);
            }
            Poll::Pending => {
                let deadline = c
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limits.deadline)));
                ready!(deadline.as_mut().poll(cx));
                return Poll::Ready(Err(Rejection::BodyTimeout(limits.deadline)));
            }
        }
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

    /// A body fed through a channel: each item a frame, or the stream's error.
    type FrameResult = Result<http_body::Frame<Bytes>, std::io::Error>;
    type Feed = tokio::sync::mpsc::UnboundedSender<Result<&'static [u8], std::io::Error>>;

    fn fed() -> (
        Feed,
        StreamBody<impl futures_core::Stream<Item = FrameResult> + Send>,
    ) {
        struct Fed(tokio::sync::mpsc::UnboundedReceiver<Result<&'static [u8], std::io::Error>>);
        impl futures_core::Stream for Fed {
            type Item = FrameResult;
            fn poll_next(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Self::Item>> {
                self.0.poll_recv(cx).map(|item| {
                    item.map(|r| r.map(|b| http_body::Frame::data(Bytes::from_static(b))))
                })
            }
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (tx, StreamBody::new(Fed(rx)))
    }

    fn echo_body(
        seen: Arc<AtomicUsize>,
    ) -> impl Service<http::Request<Bytes>, Response = Bytes, Error = Rejection, Future = impl Send>
           + Clone {
        tower::service_fn(move |req: http::Request<Bytes>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Rejection>(req.into_body()) }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_in_frames_that_wait_is_passed_on_whole_and_in_order() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_body(seen.clone()));
        let (tx, body) = fed();
        tx.send(Ok(b"12")).unwrap();
        let call = tokio::spawn(svc.oneshot(http::Request::new(body)));
        // Within the deadline, in three more frames, with waits between them.
        for frame in [&b"34"[..], b"5", b"678"] {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send(Ok(frame)).unwrap();
        }
        drop(tx);
        assert_eq!(
            call.await.unwrap().unwrap(),
            Bytes::from_static(b"12345678")
        );
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_after_a_frame_hits_the_deadline() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_body(seen.clone()));
        let (tx, body) = fed();
        tx.send(Ok(b"1234")).unwrap();
        let err = svc.oneshot(http::Request::new(body)).await.unwrap_err();
        assert!(matches!(err, Rejection::BodyTimeout(d) if d == LIMITS.deadline));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        drop(tx);
    }

    #[tokio::test]
    async fn frames_over_the_limit_together_are_refused() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_body(seen.clone()));
        let (tx, body) = fed();
        for frame in [&b"1234"[..], b"5678", b"9"] {
            tx.send(Ok(frame)).unwrap();
        }
        drop(tx);
        let err = svc.oneshot(http::Request::new(body)).await.unwrap_err();
        assert!(matches!(err, Rejection::PayloadTooLarge { limit: 8 }));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_body_that_fails_is_refused_with_its_reason() {
        let seen = Arc::new(AtomicUsize::new(0));
        let svc = BodyLimitLayer::new(LIMITS).layer(echo_body(seen.clone()));
        let (tx, body) = fed();
        tx.send(Ok(b"12")).unwrap();
        tx.send(Err(std::io::Error::other("connection reset")))
            .unwrap();
        let err = svc.oneshot(http::Request::new(body)).await.unwrap_err();
        assert!(
            matches!(&err, Rejection::InvalidRequest { message, .. } if message == "reading body: connection reset"),
            "{err:?}"
        );
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
