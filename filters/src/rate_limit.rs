//! Rate limits per peer (before the body is read) and per tool (after decoding), backed by
//! governor's GCRA limiters. A refused call carries the time until it would be allowed, which
//! fronts send as `Retry-After`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use tower::{Layer, Service};

use crate::call::{Principal, ToolCall};
use crate::future::ReadyOr;
use crate::Rejection;

/// A sustained rate with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

impl Rate {
    fn quota(self) -> Quota {
        Quota::per_second(self.per_second).allow_burst(self.burst)
    }
}

type Keyed = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

/// Limits keyed by a string (peer id or tool name), with optional per-key overrides.
pub struct KeyedLimits {
    default: Option<Keyed>,
    overrides: HashMap<String, Keyed>,
    clock: DefaultClock,
    checks: std::sync::atomic::AtomicU64,
}

/// Every this many checks, keys whose bucket is full again are forgotten, which bounds the
/// memory held for callers keyed by address.
const RETAIN_EVERY: u64 = 4096;

impl std::fmt::Debug for KeyedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedLimits")
            .field("default", &self.default.is_some())
            .field("overrides", &self.overrides.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl KeyedLimits {
    /// `default` applies to every key without an override; `None` means unlimited.
    pub fn new(default: Option<Rate>, overrides: impl IntoIterator<Item = (String, Rate)>) -> Self {
        KeyedLimits {
            default: default.map(|r| RateLimiter::keyed(r.quota())),
            overrides: overrides
                .into_iter()
                .map(|(k, r)| (k, RateLimiter::keyed(r.quota())))
                .collect(),
            clock: DefaultClock::default(),
            checks: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Take one cell for `key`, or say how long until one is available.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        let n = self
            .checks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n % RETAIN_EVERY == RETAIN_EVERY - 1 {
            self.retain_recent();
        }
        let limiter = match self.overrides.get(key) {
            Some(l) => l,
            None => match &self.default {
                Some(l) => l,
                None => return Ok(()),
            },
        };
        // Keyed limiters take an owned key; allocation only happens on this path.
        limiter
            .check_key(&key.to_owned())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forget keys whose state is back to full.
    fn retain_recent(&self) {
        if let Some(l) = &self.default {
            l.retain_recent();
        }
        for l in self.overrides.values() {
            l.retain_recent();
        }
    }
}

fn rate_limited(scope: &'static str, wait: Duration) -> Rejection {
    // Round up to whole seconds for Retry-After; never advertise 0.
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    Rejection::RateLimited {
        scope,
        retry_after: Duration::from_secs(secs.max(1)),
    }
}

/// Per-peer limit on `http::Request`s; the peer is the [`Principal`] the identity layer put in
/// the request extensions.
#[derive(Debug, Clone)]
pub struct PeerRateLimitLayer {
    limits: Arc<KeyedLimits>,
}

impl PeerRateLimitLayer {
    pub fn new(limits: Arc<KeyedLimits>) -> Self {
        PeerRateLimitLayer { limits }
    }
}

impl<S> Layer<S> for PeerRateLimitLayer {
    type Service = PeerRateLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        PeerRateLimit {
            inner,
            limits: self.limits.clone(),
        }
    }
}

/// Service of [`PeerRateLimitLayer`].
#[derive(Debug, Clone)]
pub struct PeerRateLimit<S> {
    inner: S,
    limits: Arc<KeyedLimits>,
}

impl<S, B> Service<http::Request<B>> for PeerRateLimit<S>
where
    S: Service<http::Request<B>, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(principal) = req.extensions().get::<Arc<Principal>>() else {
            // The identity layer runs first; a request without a principal is a wiring bug.
            return ReadyOr::reject(Rejection::Internal("request without principal".into()));
        };
        match self.limits.check(&principal.limit_key()) {
            Ok(()) => ReadyOr::inner(self.inner.call(req)),
            Err(wait) => ReadyOr::reject(rate_limited("peer", wait)),
        }
    }
}

/// Per-tool limit on [`ToolCall`]s.
#[derive(Debug, Clone)]
pub struct ToolRateLimitLayer {
    limits: Arc<KeyedLimits>,
}

impl ToolRateLimitLayer {
    pub fn new(limits: Arc<KeyedLimits>) -> Self {
        ToolRateLimitLayer { limits }
    }
}

impl<S> Layer<S> for ToolRateLimitLayer {
    type Service = ToolRateLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ToolRateLimit {
            inner,
            limits: self.limits.clone(),
        }
    }
}

/// Service of [`ToolRateLimitLayer`].
#[derive(Debug, Clone)]
pub struct ToolRateLimit<S> {
    inner: S,
    limits: Arc<KeyedLimits>,
}

impl<S> Service<ToolCall> for ToolRateLimit<S>
where
    S: Service<ToolCall, Error = Rejection>,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = ReadyOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        match self.limits.check(&call.tool.name) {
            Ok(()) => ReadyOr::inner(self.inner.call(call)),
            Err(wait) => ReadyOr::reject(rate_limited("tool", wait)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: u32, burst: u32) -> Rate {
        Rate {
            per_second: NonZeroU32::new(per_second).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[test]
    fn burst_then_refused_with_a_wait() {
        let l = KeyedLimits::new(Some(rate(1, 2)), []);
        assert!(l.check("a").is_ok());
        assert!(l.check("a").is_ok());
        let wait = l.check("a").unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        // Keys are independent.
        assert!(l.check("b").is_ok());
    }

    #[test]
    fn overrides_win_and_no_default_is_unlimited() {
        let l = KeyedLimits::new(None, [("slow".to_string(), rate(1, 1))]);
        for _ in 0..1000 {
            assert!(l.check("fast").is_ok());
        }
        assert!(l.check("slow").is_ok());
        assert!(l.check("slow").is_err());
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        let r = rate_limited("peer", Duration::from_millis(10));
        assert_eq!(r.retry_after(), Some(Duration::from_secs(1)));
        let r = rate_limited("peer", Duration::from_millis(1500));
        assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
    }
}
