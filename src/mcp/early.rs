//! Decide a 2026-07-28 `tools/call` from its mirrored headers before the body is read.
//!
//! A modern request names its method and tool in `Mcp-Method` and `Mcp-Name`, and the front
//! refuses a body that disagrees with them (`-32020`). So the tool's kill-switch and the
//! caller's authorization can be decided from the headers alone: a refused call costs no body
//! read and no JSON parse. Only requests whose `MCP-Protocol-Version` is 2026-07-28 (the
//! revision that makes the front check the headers) are decided here; everything else goes on
//! to the call stage, which checks the same things again. Per-tool rate limits stay in the
//! call stage alone, so a call is counted once.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

use carapace_filters::call::Principal;
use carapace_filters::future::ReadyOr;
use carapace_filters::kill_switch::KillSwitch;
use carapace_filters::signature::UnixClock;
use carapace_filters::Rejection;

use super::{decode_header_value, MODERN_VERSION};

/// Refuses a modern `tools/call` to a switched-off tool, or to one the caller may not call,
/// from its headers. Sits after identity (it reads the principal) and before the body limit.
///
/// ```
/// use std::sync::Arc;
/// use carapace::mcp::early::MirroredHeaderLayer;
/// use carapace_filters::kill_switch::{KillSwitch, Switches};
///
/// let switch = KillSwitch::in_memory(Switches::default());
/// let clock: carapace_filters::signature::UnixClock = Arc::new(carapace_filters::unix_now_ms);
/// let stack = tower::ServiceBuilder::new()
///     .layer(MirroredHeaderLayer::new(switch, clock))
///     .service_fn(|_: http::Request<()>| async {
///         Ok::<_, carapace_filters::Rejection>(http::Response::new(()))
///     });
/// # let _ = stack;
/// ```
#[derive(Clone)]
pub struct MirroredHeaderLayer {
    switch: KillSwitch,
    clock: UnixClock,
}

impl MirroredHeaderLayer {
    pub fn new(switch: KillSwitch, clock: UnixClock) -> Self {
        MirroredHeaderLayer { switch, clock }
    }
}

impl<S> Layer<S> for MirroredHeaderLayer {
    type Service = MirroredHeaderCheck<S>;
    fn layer(&self, inner: S) -> Self::Service {
        MirroredHeaderCheck {
            inner,
            switch: self.switch.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// Service of [`MirroredHeaderLayer`].
#[derive(Clone)]
pub struct MirroredHeaderCheck<S> {
    inner: S,
    switch: KillSwitch,
    clock: UnixClock,
}

/// The tool a modern `tools/call` names in its headers.
fn called_tool<B>(req: &Request<B>) -> Option<String> {
    let h = req.headers();
    let is = |name: &str, value: &str| h.get(name).is_some_and(|v| v == value);
    if req.method() != http::Method::POST
        || !is("mcp-protocol-version", MODERN_VERSION)
        || !is("mcp-method", "tools/call")
    {
        return None;
    }
    decode_header_value(h.get("mcp-name")?.to_str().ok()?)
}

impl<S, B> Service<Request<B>> for MirroredHeaderCheck<S>
where
    S: Service<Request<B>, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if let Some(tool) = called_tool(&req) {
            if let Err(r) = self.switch.check(Some(&tool)) {
                return ReadyOr::reject(r);
            }
            let allowed = req
                .extensions()
                .get::<Arc<Principal>>()
                .and_then(|p| p.permissions.as_ref())
                .is_some_and(|p| p.may_call(&tool, (self.clock)()));
            if !allowed {
                let who = req
                    .extensions()
                    .get::<Arc<Principal>>()
                    .map_or("the caller", |p| p.id.as_str());
                return ReadyOr::reject(Rejection::Forbidden(format!("{who} may not call {tool}")));
            }
        }
        ReadyOr::inner(self.inner.call(req))
    }
}
