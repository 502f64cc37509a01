//! Decide a 2026-07-28 `tools/call` from its mirrored headers before the body is read.
//!
//! A modern request names its method and tool in `Mcp-Method` and `Mcp-Name`, and the front
//! refuses a body that disagrees with them (`-32020`). So the tool's kill-switch and the
//! caller's authorization and the tool's rate limit can be decided from the headers alone: a
//! refused call costs no body read and no JSON parse. Only requests whose
//! `MCP-Protocol-Version` is 2026-07-28 (the revision that makes the front check the headers)
//! are decided here; everything else goes on to the call stage, which checks the same things,
//! in the same order (kill-switch, rate limit, authorization). A call that took its tool's cell
//! here carries [`ToolLimitTaken`], and the front runs it through a call stack without the
//! per-tool limiter, so it is counted once.

use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderName, Request};
use tower::{Layer, Service};

use carapace_filters::call::Principal;
use carapace_filters::future::Gated;
use carapace_filters::kill_switch::KillSwitch;
use carapace_filters::rate_limit::KeyedLimits;
use carapace_filters::signature::UnixClock;
use carapace_filters::Rejection;

use super::{
    decode_header_value, METHOD_HEADER, MODERN_VERSION, NAME_HEADER, PROTOCOL_VERSION_HEADER,
};
use crate::catalog::CatalogHandle;

/// Marks a request whose tool (named here) took its per-tool rate-limit cell from the headers
/// (a tool without a limit takes none, and its request is not marked).
/// Only [`MirroredHeaderCheck`] inserts it; callers cannot set request extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolLimitTaken(pub String);

/// Refuses a modern `tools/call` to a switched-off tool, to one over its rate limit, or to one
/// the caller may not call, from its headers. Sits after identity (it reads the principal) and
/// the per-peer rate limit and load shedding (a request they refuse spends no tool's cell), and
/// before the body limit. `limits` must be the same [`KeyedLimits`] the call stage uses. A name
/// the catalog does not hold is left to the front, which refuses it (`TOOL_NOT_FOUND`) before
/// any limit, as the call stage does: it takes no cell and makes no key in the limiter.
///
/// ```
/// use std::sync::Arc;
/// use carapace::catalog::CatalogHandle;
/// use carapace::mcp::early::MirroredHeaderLayer;
/// use carapace_filters::kill_switch::{KillSwitch, Switches};
/// use carapace_filters::rate_limit::KeyedLimits;
///
/// let switch = KillSwitch::in_memory(Switches::default());
/// let limits = Arc::new(KeyedLimits::new(None, []));
/// let clock: carapace_filters::signature::UnixClock = Arc::new(carapace_filters::unix_now_ms);
/// let catalog = Arc::new(CatalogHandle::default());
/// let stack = tower::ServiceBuilder::new()
///     .layer(MirroredHeaderLayer::new(switch, limits, catalog, clock))
///     .service_fn(|_: http::Request<()>| async {
///         Ok::<_, carapace_filters::Rejection>(http::Response::new(()))
///     });
/// # let _ = stack;
/// ```
#[derive(Clone)]
pub struct MirroredHeaderLayer {
    switch: KillSwitch,
    limits: Arc<KeyedLimits>,
    catalog: Arc<CatalogHandle>,
    clock: UnixClock,
}

impl MirroredHeaderLayer {
    pub fn new(
        switch: KillSwitch,
        limits: Arc<KeyedLimits>,
        catalog: Arc<CatalogHandle>,
        clock: UnixClock,
    ) -> Self {
        MirroredHeaderLayer {
            switch,
            limits,
            catalog,
            clock,
        }
    }
}

impl<S> Layer<S> for MirroredHeaderLayer {
    type Service = MirroredHeaderCheck<S>;
    fn layer(&self, inner: S) -> Self::Service {
        MirroredHeaderCheck {
            inner,
            switch: self.switch.clone(),
            limits: self.limits.clone(),
            catalog: self.catalog.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// Service of [`MirroredHeaderLayer`].
#[derive(Clone)]
pub struct MirroredHeaderCheck<S> {
    inner: S,
    switch: KillSwitch,
    limits: Arc<KeyedLimits>,
    catalog: Arc<CatalogHandle>,
    clock: UnixClock,
}

/// The tool a modern `tools/call` names in its headers (borrowed when it needs no decoding).
fn called_tool<B>(req: &Request<B>) -> Option<Cow<'_, str>> {
    let h = req.headers();
    let is = |name: &HeaderName, value: &str| h.get(name).is_some_and(|v| v == value);
    if req.method() != http::Method::POST
        || !is(&PROTOCOL_VERSION_HEADER, MODERN_VERSION)
        || !is(&METHOD_HEADER, "tools/call")
    {
        return None;
    }
    decode_header_value(h.get(&NAME_HEADER)?.to_str().ok()?)
}

impl<S> MirroredHeaderCheck<S> {
    /// The caller's authorization for `tool`.
    fn authorized<B>(&self, req: &Request<B>, tool: &str) -> Result<(), Rejection> {
        let principal = req.extensions().get::<Arc<Principal>>();
        let permissions = principal.and_then(|p| p.permissions.as_ref());
        if permissions.is_some_and(|p| p.may_call(tool, (self.clock)())) {
            return Ok(());
        }
        let who = principal.map_or("the caller", |p| &*p.id);
        let action = format!("tool.call:{tool}");
        Err(match permissions {
            Some(p) => p.refusal(who, &action),
            None => Rejection::Forbidden(format!("{who} may not {action}")),
        })
    }
}

impl<S, B> Service<Request<B>> for MirroredHeaderCheck<S>
where
    S: Service<Request<B>, Error = Rejection> + Clone,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = Gated<S, Request<B>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let Some(tool) = called_tool(&req).filter(|t| self.catalog.serves(t)) else {
            return Gated::inner(self.inner.call(req));
        };
        if let Err(r) = self.switch.check(Some(&tool)) {
            return Gated::reject(r);
        }
        // As in the call stage: a caller refused the tool takes none of its shared cells.
        if let Err(r) = self.authorized(&req, &tool) {
            return Gated::reject(r);
        }
        let pending = match self.limits.check(&tool).decide("tool") {
            Err(limited) => return Gated::reject(limited),
            Ok(pending) => pending,
        };
        // Only a cell taken needs the mark (a tool without a limit takes none in either place);
        // only the mark owns a copy of the tool's name.
        if let Some(taken) = self
            .limits
            .limits(&tool)
            .then(|| ToolLimitTaken(tool.into_owned()))
        {
            req.extensions_mut().insert(taken);
        }
        match pending {
            None => Gated::inner(self.inner.call(req)),
            Some(check) => {
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                Gated::checking(Box::pin(check), ready, req)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::sync::Mutex;
    use std::time::Duration;

    use carapace_filters::kill_switch::Switches;
    use carapace_filters::rate_limit::Rate;
    use carapace_filters::shared::{SharedLimits, SharedStateError};
    use carapace_filters::BoxFuture;
    use tower::ServiceExt;

    use super::*;

    /// A shared store that allows the first `allow` takes, and records every key it is asked.
    struct Store {
        asked: Mutex<Vec<String>>,
        allow: usize,
    }

    impl SharedLimits for Store {
        fn take(
            &self,
            key: &str,
            _: Rate,
        ) -> BoxFuture<Result<Result<(), Duration>, SharedStateError>> {
            let mut asked = self.asked.lock().unwrap();
            asked.push(key.to_owned());
            let r = if asked.len() <= self.allow {
                Ok(())
            } else {
                Err(Duration::from_secs(3))
            };
            Box::pin(async move { Ok(r) })
        }
    }

    fn one_a_minute() -> Rate {
        Rate::per(
            NonZeroU32::new(1).unwrap(),
            Duration::from_secs(60),
            NonZeroU32::new(1).unwrap(),
        )
    }

    fn request(tool: &str, principal: Principal) -> Request<()> {
        let mut req = Request::post("/mcp")
            .header("mcp-protocol-version", MODERN_VERSION)
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .body(())
            .unwrap();
        req.extensions_mut().insert(Arc::new(principal));
        req
    }

    fn stranger() -> Principal {
        Principal {
            permissions: None,
            ..Principal::local()
        }
    }

    /// What reached the inner service: the tool whose cell was taken, if any.
    async fn run(
        limits: Arc<KeyedLimits>,
        req: Request<()>,
    ) -> Result<Option<ToolLimitTaken>, Rejection> {
        let clock: UnixClock = Arc::new(|| 0);
        let catalog = CatalogHandle::default();
        let mut tools = crate::catalog::Catalog::default();
        for name in ["t", "u"] {
            tools
                .tools
                .insert(name.into(), crate::front::tool_call(None).tool);
        }
        catalog.replace(tools);
        let switch = KillSwitch::in_memory(Switches::default());
        let layer = MirroredHeaderLayer::new(switch, limits, Arc::new(catalog), clock);
        let inner = tower::service_fn(|req: Request<()>| async move {
            Ok::<_, Rejection>(req.extensions().get::<ToolLimitTaken>().cloned())
        });
        layer.layer(inner).oneshot(req).await
    }

    #[tokio::test]
    async fn a_call_takes_its_cell_once_and_is_marked_for_the_front() {
        let limits = Arc::new(KeyedLimits::new(None, [("t".into(), one_a_minute())]));
        let first = run(limits.clone(), request("t", Principal::local())).await;
        assert_eq!(first.unwrap(), Some(ToolLimitTaken("t".into())));
        let second = run(limits.clone(), request("t", Principal::local())).await;
        assert!(
            matches!(second, Err(Rejection::RateLimited { scope: "tool", .. })),
            "{second:?}"
        );
        // A tool without a limit takes no cell: unmarked, and never limited.
        for _ in 0..3 {
            let other = run(limits.clone(), request("u", Principal::local())).await;
            assert_eq!(other.unwrap(), None);
        }
        // A name the catalog does not hold is left to the front (TOOL_NOT_FOUND there): no
        // cell taken, however many come, and no key made in the limiter for it.
        let every = Arc::new(KeyedLimits::new(Some(one_a_minute()), []));
        for _ in 0..3 {
            let unknown = run(every.clone(), request("no-such-tool", Principal::local())).await;
            assert_eq!(unknown.unwrap(), None);
        }
        assert!(run(every.clone(), request("t", Principal::local()))
            .await
            .is_ok());
        // Not a modern tools/call: untouched, unmarked.
        let mut list = request("t", Principal::local());
        list.headers_mut()
            .insert("mcp-method", http::HeaderValue::from_static("tools/list"));
        assert_eq!(run(limits, list).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_caller_refused_the_tool_takes_none_of_its_cells() {
        let store = Arc::new(Store {
            asked: Mutex::default(),
            allow: 1,
        });
        let limits = Arc::new(KeyedLimits::shared(
            "tool",
            Some(one_a_minute()),
            [],
            store.clone(),
        ));
        // However often a caller who may not call the tool asks, the store is not asked.
        for _ in 0..3 {
            let denied = run(limits.clone(), request("t", stranger())).await;
            assert!(matches!(denied, Err(Rejection::Forbidden(_))), "{denied:?}");
        }
        assert!(store.asked.lock().unwrap().is_empty());
        // The tool's one cell is still there for a caller who may call it.
        let allowed = run(limits.clone(), request("t", Principal::local())).await;
        assert_eq!(allowed.unwrap(), Some(ToolLimitTaken("t".into())));
        let limited = run(limits.clone(), request("t", Principal::local())).await;
        assert!(
            matches!(limited, Err(Rejection::RateLimited { .. })),
            "{limited:?}"
        );
        assert_eq!(*store.asked.lock().unwrap(), vec!["tool:t", "tool:t"]);
    }
}
