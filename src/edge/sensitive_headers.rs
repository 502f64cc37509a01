//! Headers whose values must never be shown: marked [sensitive] on every request and answer,
//! so a log line or a trace that prints them shows `Sensitive` instead of the value, and HTTP/2
//! never puts them in its compression table.
//!
//! tower-http's `SetSensitiveHeadersLayer` does the same by looking each name up in the map
//! (an `entry` per name, hashing it and making room for a value that is then not inserted);
//! this layer walks the few headers a request has once and compares names, which costs a
//! fraction of that on every call.
//!
//! [sensitive]: http::HeaderValue::set_sensitive

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, HeaderName, Request, Response};
use tower::{Layer, Service};

/// Marks the values of `names` sensitive on requests and on their answers.
///
/// ```
/// use carapace::edge::sensitive_headers::SensitiveHeadersLayer;
/// use http::{header, Request, Response};
/// use std::sync::Arc;
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let mut svc = ServiceBuilder::new()
///     .layer(SensitiveHeadersLayer::new(Arc::new([header::AUTHORIZATION])))
///     .service(service_fn(|req: Request<()>| async move {
///         assert!(req.headers()[header::AUTHORIZATION].is_sensitive());
///         Ok::<_, std::convert::Infallible>(Response::new(()))
///     }));
/// let req = Request::builder()
///     .header(header::AUTHORIZATION, "Bearer secret")
///     .body(())
///     .unwrap();
/// svc.ready().await.unwrap().call(req).await.unwrap();
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct SensitiveHeadersLayer {
    names: Arc<[HeaderName]>,
}

impl SensitiveHeadersLayer {
    pub fn new(names: Arc<[HeaderName]>) -> Self {
        SensitiveHeadersLayer { names }
    }
}

impl<S> Layer<S> for SensitiveHeadersLayer {
    type Service = SensitiveHeaders<S>;
    fn layer(&self, inner: S) -> Self::Service {
        SensitiveHeaders {
            inner,
            names: self.names.clone(),
        }
    }
}

/// Service of [`SensitiveHeadersLayer`].
#[derive(Debug, Clone)]
pub struct SensitiveHeaders<S> {
    inner: S,
    names: Arc<[HeaderName]>,
}

/// Marks every value of a header named in `names` sensitive, in one walk over the map.
fn mark(headers: &mut HeaderMap, names: &[HeaderName]) {
    for (name, value) in headers.iter_mut() {
        if names.contains(name) {
            value.set_sensitive(true);
        }
    }
}

impl<S, B, R> Service<Request<B>> for SensitiveHeaders<S>
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
        mark(req.headers_mut(), &self.names);
        ResponseFuture {
            inner: self.inner.call(req),
            names: self.names.clone(),
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`SensitiveHeaders`]: marks the answer's headers.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        names: Arc<[HeaderName]>,
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
        mark(res.headers_mut(), this.names);
        Poll::Ready(Ok(res))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;
    use http::HeaderValue;
    use tower::{service_fn, ServiceExt};

    fn names() -> Arc<[HeaderName]> {
        Arc::new([
            header::AUTHORIZATION,
            header::SET_COOKIE,
            HeaderName::from_static("x-api-key"),
        ])
    }

    /// What the inner service saw of the request's headers, as (name, value, sensitive).
    type Seen = Vec<(String, String, bool)>;

    fn seen(headers: &HeaderMap) -> Seen {
        headers
            .iter()
            .map(|(n, v)| {
                let v2 = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (n.to_string(), v2, v.is_sensitive())
            })
            .collect()
    }

    #[tokio::test]
    async fn named_headers_are_marked_both_ways_and_nothing_else_changes() {
        let svc =
            SensitiveHeadersLayer::new(names()).layer(service_fn(|req: Request<()>| async move {
                let mut res = Response::new(seen(req.headers()));
                let h = res.headers_mut();
                h.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
                h.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                Ok::<_, std::convert::Infallible>(res)
            }));
        let req = Request::builder()
            .header(header::AUTHORIZATION, "Bearer t")
            .header("X-Api-Key", "k1")
            .header("x-api-key", "k2")
            .header(header::HOST, "h")
            .header("x-api-keys", "not one of them")
            .body(())
            .unwrap();
        let res = svc.oneshot(req).await.unwrap();
        let mut reached = res.body().clone();
        reached.sort();
        assert_eq!(
            reached,
            vec![
                ("authorization".into(), "Bearer t".into(), true),
                ("host".into(), "h".into(), false),
                ("x-api-key".into(), "k1".into(), true),
                ("x-api-key".into(), "k2".into(), true),
                ("x-api-keys".into(), "not one of them".into(), false),
            ]
        );
        let answered = seen(res.headers());
        assert_eq!(
            answered,
            vec![
                ("set-cookie".into(), "a=1".into(), true),
                ("set-cookie".into(), "b=2".into(), true),
                ("content-type".into(), "text/plain".into(), false),
            ]
        );
        // What a log line of the map shows.
        let shown = format!("{:?}", res.headers());
        assert!(
            !shown.contains("a=1") && shown.contains("Sensitive"),
            "{shown}"
        );
    }
}
