//! What both fronts share: the response type, the record of each call for metrics, the outer
//! service that turns a [`Rejection`] from the HTTP-stage layers into the front's envelope,
//! and JSON response helpers.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::Service;

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};

use crate::config::Protocol;
use crate::metrics::Metrics;

/// Every response carapace sends to callers.
pub type Resp = Response<Full<Bytes>>;

/// The call-stage stack a front hands decoded calls to.
pub type CallStack = tower::util::BoxCloneSyncService<ToolCall, CallOutcome, Rejection>;

/// Put in a response's extensions by a front: which tool, and how the call ended.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub tool: Option<String>,
    pub outcome: &'static str,
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Resp {
    let bytes = serde_json::to_vec(body).expect("JSON value serializes");
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Turns the HTTP-stage rejections into the front's envelope and records metrics. The
/// outermost service of every listener.
#[derive(Clone)]
pub struct Envelope<S> {
    inner: S,
    front: Protocol,
    metrics: Arc<Metrics>,
}

impl<S> Envelope<S> {
    pub fn new(inner: S, front: Protocol, metrics: Arc<Metrics>) -> Self {
        Envelope {
            inner,
            front,
            metrics,
        }
    }
}

/// The front's error envelope for a rejection that happened before a call was decoded.
pub fn rejection_response(front: Protocol, r: &Rejection) -> Resp {
    match front {
        Protocol::ToolsV1 => crate::tools_v1::error_response(r, "", "", 0),
        Protocol::SkillV1 => crate::skill_v1::error_response(r),
    }
}

impl<S, B> Service<Request<B>> for Envelope<S>
where
    S: Service<Request<B>, Response = Resp, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Resp;
    type Error = Infallible;
    type Future = BoxFuture<Result<Resp, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let mut inner = self.inner.clone();
        let front = self.front;
        let metrics = self.metrics.clone();
        let started = Instant::now();
        Box::pin(async move {
            let fut = std::future::poll_fn(|cx| inner.poll_ready(cx));
            let result = match fut.await {
                Ok(()) => inner.call(req).await,
                Err(e) => Err(e),
            };
            let resp = match result {
                Ok(resp) => resp,
                Err(r) => {
                    if matches!(r, Rejection::Internal(_)) {
                        tracing::error!(error = %r, "internal error");
                    }
                    let mut resp = rejection_response(front, &r);
                    resp.extensions_mut().insert(CallRecord {
                        tool: None,
                        outcome: r.reason(),
                    });
                    resp
                }
            };
            let record = resp.extensions().get::<CallRecord>();
            let outcome = record.map_or("none", |r| r.outcome);
            if !matches!(outcome, "ok" | "app_error" | "none") {
                tracing::info!(
                    front = %front,
                    tool = record.and_then(|r| r.tool.as_deref()).unwrap_or(""),
                    reason = outcome,
                    status = resp.status().as_u16(),
                    "call refused"
                );
            }
            metrics.observe(
                front,
                record.and_then(|r| r.tool.as_deref()),
                record.map_or("none", |r| r.outcome),
                started.elapsed(),
            );
            Ok(resp)
        })
    }
}
