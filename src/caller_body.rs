//! The caller's request body, and what happens to the part of it a refusal leaves unread.
//!
//! Most refusals (identity, kill-switch, rate limit, load shedding, a declared
//! `Content-Length` over the limit) come before the body is read. Dropping the rest would make
//! the connection close with the caller still sending, and a caller that writes its whole body
//! before reading the answer would lose the answer to the reset. So the listener wraps each
//! body in a [`CallerBody`]; one dropped before its end comes back as [`Unread`], and
//! [`settle`] decides before the answer goes out:
//!
//! - a rest of at most [`DRAIN_MAX_BYTES`] (by its declared length) is read and discarded in
//!   the background while the answer is sent, and the connection stays open;
//! - anything else (larger, of unknown length, already past the body deadline, or a caller
//!   waiting for `100 Continue`, which must never be solicited for a body nobody reads)
//!   closes the connection: HTTP/1 answers carry `Connection: close`, and
//!   [`crate::lingering`] keeps reading while the caller finishes sending so that it gets the
//!   answer. On HTTP/2 only the stream is reset (`NO_ERROR`, after the answer).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;

use carapace_filters::Rejection;

use crate::front::CallRecord;

/// The largest unread rest that is read and discarded to keep the connection open.
pub const DRAIN_MAX_BYTES: u64 = 64 * 1024;
/// How long that background read may take before the connection is closed instead.
pub const DRAIN_TIME: Duration = Duration::from_secs(5);

/// A request body that, dropped before its end, goes back to the connection as [`Unread`].
#[derive(Debug)]
pub struct CallerBody {
    /// Boxed: the request is moved through every layer of the edge, and with the body inline
    /// it is 280 bytes, past the 256 up to which each move is glibc's short copy.
    inner: Option<Box<Incoming>>,
    unread: Option<oneshot::Sender<Incoming>>,
}

// The edge's layers take the request by value: keep each move glibc's short copy.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<http::Request<CallerBody>>() <= 256);

/// The rest of a body a layer dropped unread, once the stack has answered.
#[derive(Debug)]
pub struct Unread(oneshot::Receiver<Incoming>);

impl CallerBody {
    /// Wrap a body; a body already at its end needs no way back.
    pub fn new(inner: Incoming) -> (Self, Option<Unread>) {
        if inner.is_end_stream() {
            let body = CallerBody {
                inner: Some(Box::new(inner)),
                unread: None,
            };
            return (body, None);
        }
        let (tx, rx) = oneshot::channel();
        let body = CallerBody {
            inner: Some(Box::new(inner)),
            unread: Some(tx),
        };
        (body, Some(Unread(rx)))
    }
}

impl Unread {
    /// The rest, if the body was dropped before its end by the time the stack answered.
    pub fn take(mut self) -> Option<Incoming> {
        self.0.try_recv().ok()
    }
}

impl Body for CallerBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(body) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = Pin::new(&mut **body).poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // Read to its end, or broken: nothing to give back.
            this.unread = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_deref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_deref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for CallerBody {
    fn drop(&mut self) {
        if let (Some(tx), Some(body)) = (self.unread.take(), self.inner.take()) {
            if !body.is_end_stream() {
                let _ = tx.send(*body);
            }
        }
    }
}

/// What the caller's request said about its body, taken before the stack sees it.
#[derive(Debug, Clone, Copy)]
pub struct BodyExpectation {
    pub version: Version,
    /// `Expect: 100-continue`: the caller sends the body only when asked.
    pub waits_for_continue: bool,
}

impl BodyExpectation {
    pub fn of<B>(req: &http::Request<B>) -> Self {
        BodyExpectation {
            version: req.version(),
            waits_for_continue: req
                .headers()
                .get(http::header::EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue")),
        }
    }
}

/// Decide the fate of an unread rest before `resp` goes out (see the module docs).
pub fn settle<B>(rest: Incoming, expectation: BodyExpectation, resp: &mut Response<B>) {
    let small = rest
        .size_hint()
        .upper()
        .is_some_and(|n| n <= DRAIN_MAX_BYTES);
    // A body that already missed its deadline will not arrive in time now.
    let stalled = resp
        .extensions()
        .get::<CallRecord>()
        .is_some_and(|r| r.outcome == Rejection::BodyTimeout(Duration::ZERO).reason());
    if small && !stalled && !expectation.waits_for_continue {
        tokio::spawn(discard(rest));
        return;
    }
    drop(rest);
    if expectation.version < Version::HTTP_2 {
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// Read a rest to its end and drop it, bounded in time and size.
async fn discard(mut rest: Incoming) {
    let mut left = DRAIN_MAX_BYTES;
    let read = async {
        while let Some(frame) = rest.frame().await {
            let Ok(frame) = frame else { return };
            if let Some(data) = frame.data_ref() {
                let n = data.len() as u64;
                if n > left {
                    return;
                }
                left -= n;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}
