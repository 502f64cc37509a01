//! The remote control plane: `/v1/control/*` on the mTLS listener, for paired operators.
//!
//! Each route is an admin-socket action guarded by a `control:<action>` permission (the
//! `cli_admin` role has `control:*`). Starting a pairing is `pair.start`, which no role or
//! policy grants remotely: the pairing trigger exists only on the local admin socket. The
//! routes sit right after the identity layer, before the kill-switch, so an operator can
//! release a global kill-switch remotely.

use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use crate::caller_body::CallerBody;
use futures_util::future::Either;
use http::{Request, Response};
use tower::Service;

use carapace_filters::authorization::PAIR_START;
use carapace_filters::call::Principal;
use carapace_filters::{BoxFuture, Rejection};

use crate::front::Resp;
use crate::server::shared::Shared;

/// Prefix of the control routes.
pub const PREFIX: &str = "/v1/control/";

/// The action a control path asks for, and the admin route that serves it.
fn action(path: &str) -> Option<(&'static str, &'static str)> {
    Some(match path.strip_prefix(PREFIX)? {
        "kill-switch" => ("control:kill_switch", "/v1/kill-switch"),
        "peers" => ("control:peers.list", "/v1/peers"),
        "peers/revoke" => ("control:peers.revoke", "/v1/peers/revoke"),
        "reload" => ("control:reload", "/v1/reload"),
        "gateway" => ("control:identity", "/v1/gateway"),
        "pairings" => (PAIR_START, "/v1/pairings"),
        _ => return None,
    })
}

/// Adds [`ControlPlane`] to a stack.
#[derive(Clone)]
pub struct ControlPlaneLayer {
    shared: Weak<Shared>,
}

impl ControlPlaneLayer {
    pub fn new(shared: Weak<Shared>) -> Self {
        ControlPlaneLayer { shared }
    }
}

impl<S> tower::Layer<S> for ControlPlaneLayer {
    type Service = ControlPlane<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ControlPlane::new(inner, self.shared.clone())
    }
}

/// Serves control routes; everything else goes on to `inner`.
#[derive(Clone)]
pub struct ControlPlane<S> {
    inner: S,
    shared: Weak<Shared>,
}

impl<S> ControlPlane<S> {
    pub fn new(inner: S, shared: Weak<Shared>) -> Self {
        ControlPlane { inner, shared }
    }
}

impl<S> Service<Request<CallerBody>> for ControlPlane<S>
where
    S: Service<Request<CallerBody>, Response = Resp, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Resp;
    type Error = Rejection;
    type Future = Either<S::Future, BoxFuture<Result<Resp, Rejection>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<CallerBody>) -> Self::Future {
        if !req.uri().path().starts_with(PREFIX) {
            return Either::Left(self.inner.call(req));
        }
        let shared = self.shared.clone();
        Either::Right(Box::pin(async move {
            let (permission, route) = action(req.uri().path())
                .ok_or_else(|| Rejection::NoRoute(req.uri().path().to_string()))?;
            let principal = req
                .extensions()
                .get::<Arc<Principal>>()
                .cloned()
                .ok_or_else(|| Rejection::Internal("request without principal".into()))?;
            let shared = shared
                .upgrade()
                .ok_or_else(|| Rejection::Internal("shutting down".into()))?;
            let allowed = principal
                .permissions
                .as_ref()
                .is_some_and(|p| p.allows(permission, (shared.clock)()));
            if !allowed {
                return Err(Rejection::Forbidden(format!(
                    "{} may not {permission} remotely",
                    principal.id
                )));
            }
            tracing::warn!(
                "control_action peer={} action={permission} method={}",
                principal.id,
                req.method()
            );
            *req.uri_mut() = route.parse().expect("static route");
            let resp: Response<_> = crate::ops::admin::handle(shared, req).await;
            Ok(resp)
        }))
    }
}
