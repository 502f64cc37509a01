//! A request id for every request: the caller's `x-request-id` when it is usable and single,
//! else one carapace makes; put on the request as a [`RequestId`] extension (the fronts give it
//! to their calls, and so to the app) and on the answer. The request's own headers keep only a
//! caller's id that was kept: an unusable or repeated one is removed, and one carapace makes is
//! not added (nothing after the edge reads the header, and adding one to a request whose header
//! table hyper sized to what it parsed would grow the table).
//!
//! What tower-http's `SetRequestIdLayer` and `PropagateRequestIdLayer` did here, with the
//! check of the caller's id before them, in one layer: the id is looked up once per request
//! instead of three times.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{HeaderValue, Request, Response};
use tower::{Layer, Service};

use carapace_filters::call::REQUEST_ID;

/// Longest request id taken from a caller.
const MAX_REQUEST_ID: usize = 128;

/// The request id of a request, in its extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub HeaderValue);

/// Whether a caller's request id is kept: 1 to 128 characters of `A-Z a-z 0-9 . _ : -`, so it
/// can go into log lines and on to the app as it is.
pub fn is_usable_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_REQUEST_ID
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// Length of a request id carapace makes: 16 random bytes, hex.
const MADE_ID_LEN: usize = 32;

/// Request ids made at once by [`MadeIds`].
const IDS_PER_BLOCK: usize = 64;

/// Request ids made ahead, a block at a time, for one thread: one fill from the thread's
/// cryptographic generator and one allocation for [`IDS_PER_BLOCK`] ids. Each id is a slice of
/// its block, so handing one out and cloning it only counts a reference (an id made alone was
/// an allocation, and a second one at its first clone); a block is freed when the last request
/// holding one of its ids is done.
struct MadeIds {
    block: bytes::Bytes,
}

impl MadeIds {
    fn next(&mut self) -> HeaderValue {
        if self.block.is_empty() {
            self.block = Self::block();
        }
        let id = self.block.split_to(MADE_ID_LEN);
        // SAFETY: every byte of a block is one of `HEX_DIGITS` (see `block`), all of them
        // visible ASCII and so valid in a header value. (With debug assertions the http crate
        // checks it and panics otherwise; the tests below run that way.)
        unsafe { HeaderValue::from_maybe_shared_unchecked(id) }
    }

    /// [`IDS_PER_BLOCK`] ids of 16 random bytes each, in lowercase hex.
    fn block() -> bytes::Bytes {
        use rand::RngCore;
        const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut random = [0u8; MADE_ID_LEN / 2 * IDS_PER_BLOCK];
        rand::thread_rng().fill_bytes(&mut random);
        let mut hex = vec![0u8; MADE_ID_LEN * IDS_PER_BLOCK];
        for (digits, byte) in hex.chunks_exact_mut(2).zip(random) {
            digits[0] = HEX_DIGITS[usize::from(byte >> 4)];
            digits[1] = HEX_DIGITS[usize::from(byte & 0x0f)];
        }
        bytes::Bytes::from(hex)
    }
}

thread_local! {
    static MADE_IDS: std::cell::RefCell<MadeIds> = const {
        std::cell::RefCell::new(MadeIds { block: bytes::Bytes::new() })
    };
}

/// A request id made by carapace: 16 random bytes, hex.
fn random_request_id() -> HeaderValue {
    MADE_IDS.with(|ids| ids.borrow_mut().next())
}

/// Gives every request a request id and its answer the same `x-request-id`.
///
/// ```
/// use carapace::edge::request_id::{RequestId, RequestIdLayer};
/// use http::{Request, Response};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let svc = ServiceBuilder::new()
///     .layer(RequestIdLayer)
///     .service(service_fn(|req: Request<()>| async move {
///         assert_eq!(req.extensions().get::<RequestId>().unwrap().0, "req-1");
///         Ok::<_, std::convert::Infallible>(Response::new(()))
///     }));
/// let req = Request::builder().header("x-request-id", "req-1").body(()).unwrap();
/// let res = svc.oneshot(req).await.unwrap();
/// assert_eq!(res.headers()["x-request-id"], "req-1");
/// # });
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIds<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestIds { inner }
    }
}

/// Service of [`RequestIdLayer`].
#[derive(Debug, Clone, Copy)]
pub struct RequestIds<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for RequestIds<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let headers = req.headers_mut();
        let mut sent = headers.get_all(REQUEST_ID).iter();
        let id = match (sent.next(), sent.next()) {
            (Some(v), None) if is_usable_request_id(v) => v.clone(),
            (None, _) => random_request_id(),
            // An unusable one, or more than one: none goes on; carapace makes one.
            _ => {
                headers.remove(REQUEST_ID);
                random_request_id()
            }
        };
        req.extensions_mut().insert(RequestId(id.clone()));
        ResponseFuture {
            inner: self.inner.call(req),
            id: Some(id),
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`RequestIds`]: the answer gets the request's id unless it has one.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        id: Option<HeaderValue>,
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = ready!(this.inner.poll(cx))?;
        if let Some(id) = this.id.take() {
            res.headers_mut().entry(REQUEST_ID).or_insert(id);
        }
        Poll::Ready(Ok(res))
    }
}

/// The request id a front puts on its call.
pub fn request_id<B>(req: &Request<B>) -> Option<HeaderValue> {
    req.extensions().get::<RequestId>().map(|id| id.0.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{service_fn, ServiceExt};

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

    /// The ids the inner service saw (header values, extension) and the answer's header.
    async fn ids(sent: &[&str], answer_has: Option<&'static str>) -> (Vec<String>, String, String) {
        let svc = RequestIdLayer.layer(service_fn(move |req: Request<()>| async move {
            let headers: Vec<String> = req
                .headers()
                .get_all(REQUEST_ID)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect();
            let ext = request_id(&req).unwrap().to_str().unwrap().to_string();
            let mut res = Response::new((headers, ext));
            if let Some(v) = answer_has {
                res.headers_mut()
                    .insert(REQUEST_ID, HeaderValue::from_static(v));
            }
            Ok::<_, std::convert::Infallible>(res)
        }));
        let mut req = Request::new(());
        for v in sent {
            req.headers_mut()
                .append(REQUEST_ID, HeaderValue::from_bytes(v.as_bytes()).unwrap());
        }
        let res = svc.oneshot(req).await.unwrap();
        let answered = res.headers()[REQUEST_ID].to_str().unwrap().to_string();
        assert_eq!(res.headers().get_all(REQUEST_ID).iter().count(), 1);
        let (headers, ext) = res.into_body();
        (headers, ext, answered)
    }

    fn is_made(id: &str) -> bool {
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
    }

    #[tokio::test]
    async fn a_usable_single_id_is_kept_on_the_request_and_the_answer() {
        let (headers, ext, answered) = ids(&["req-1"], None).await;
        assert_eq!(headers, ["req-1"]);
        assert_eq!((ext.as_str(), answered.as_str()), ("req-1", "req-1"));
    }

    #[tokio::test]
    async fn a_missing_unusable_or_repeated_id_is_replaced_by_one_carapace_makes_in_the_extension()
    {
        for sent in [&[][..], &["a b"], &["<script>"], &["one", "two"]] {
            let (headers, ext, answered) = ids(sent, None).await;
            assert!(is_made(&ext), "{sent:?}: {ext}");
            assert!(headers.is_empty(), "{sent:?}: {headers:?}");
            assert_eq!(answered, ext, "{sent:?}");
        }
        let (_, a, _) = ids(&[], None).await;
        let (_, b, _) = ids(&[], None).await;
        assert_ne!(a, b);
    }

    #[test]
    fn made_ids_are_random_hex_and_outlive_their_block() {
        let first = random_request_id();
        let kept = first.to_str().unwrap().to_string();
        // Several blocks' worth: every id is new, and the first reads the same after them.
        let mut seen = std::collections::HashSet::from([kept.clone()]);
        for _ in 0..IDS_PER_BLOCK * 3 {
            let id = random_request_id();
            let id = id.to_str().unwrap();
            assert!(is_made(id), "{id}");
            assert!(seen.insert(id.to_string()), "{id} made twice");
        }
        assert_eq!(first.to_str().unwrap(), kept);
        assert!(is_made(&kept));
    }

    #[tokio::test]
    async fn an_answer_that_names_its_own_id_keeps_it() {
        let (_, ext, answered) = ids(&["req-1"], Some("app-9")).await;
        assert_eq!((ext.as_str(), answered.as_str()), ("req-1", "app-9"));
    }
}
