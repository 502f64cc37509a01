//! Rate limits per peer (before the body is read) and per tool (after decoding), backed by
//! governor's GCRA limiters in this process, or by a [`SharedLimits`] store that every replica
//! uses so that a limit holds for the whole set. A refused call carries the time until it would
//! be allowed, which fronts send as `Retry-After`. A shared store that cannot answer refuses the
//! call ([`Rejection::SharedStateUnavailable`]).

use std::cell::RefCell;
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
use crate::future::Gated;
use crate::shared::SharedLimits;
use crate::{BoxFuture, Rejection};

thread_local! {
    /// The key a local limit is looked up with, reused (see [`KeyedLimits::check`]).
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A sustained rate with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Time between two cells at the sustained rate (1 s / 10 for 10 per second, 20 s for 3
    /// per minute).
    pub period: Duration,
    pub burst: NonZeroU32,
}

impl Rate {
    /// `n` calls per `window` sustained, with `burst` at once.
    pub fn per(n: NonZeroU32, window: Duration, burst: NonZeroU32) -> Rate {
        Rate {
            period: (window / n.get()).max(Duration::from_nanos(1)),
            burst,
        }
    }

    /// Time between two cells at the sustained rate.
    pub fn emission_interval(self) -> Duration {
        self.period
    }

    fn quota(self) -> Quota {
        Quota::with_period(self.period)
            .expect("period is never zero")
            .allow_burst(self.burst)
    }
}

type Keyed = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

/// Limits keyed by a string (peer id or tool name), with optional per-key overrides.
pub struct KeyedLimits {
    backend: Backend,
}

enum Backend {
    Local {
        default: Option<Keyed>,
        overrides: HashMap<String, Keyed>,
        clock: DefaultClock,
        checks: std::sync::atomic::AtomicU64,
    },
    Shared {
        scope: &'static str,
        default: Option<Rate>,
        overrides: HashMap<String, Rate>,
        store: Arc<dyn SharedLimits>,
    },
}

/// The answer of [`KeyedLimits::check`].
pub enum LimitCheck {
    /// A cell was taken.
    Allowed,
    /// Refused: a cell frees up after this long.
    Wait(Duration),
    /// The shared store decides; resolves to `Ok` when a cell was taken.
    Pending(BoxFuture<Result<(), Rejection>>),
}

/// Every this many checks, keys whose bucket is full again are forgotten, which bounds the
/// memory held for callers keyed by address.
const RETAIN_EVERY: u64 = 4096;

impl std::fmt::Debug for KeyedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.backend {
            Backend::Local {
                default, overrides, ..
            } => f
                .debug_struct("KeyedLimits")
                .field("default", &default.is_some())
                .field("overrides", &overrides.keys().collect::<Vec<_>>())
                .finish(),
            Backend::Shared {
                scope,
                default,
                overrides,
                ..
            } => f
                .debug_struct("KeyedLimits")
                .field("shared", scope)
                .field("default", default)
                .field("overrides", overrides)
                .finish(),
        }
    }
}

impl KeyedLimits {
    /// `default` applies to every key without an override; `None` means unlimited.
    pub fn new(default: Option<Rate>, overrides: impl IntoIterator<Item = (String, Rate)>) -> Self {
        KeyedLimits {
            backend: Backend::Local {
                default: default.map(|r| RateLimiter::keyed(r.quota())),
                overrides: overrides
                    .into_iter()
                    .map(|(k, r)| (k, RateLimiter::keyed(r.quota())))
                    .collect(),
                clock: DefaultClock::default(),
                checks: std::sync::atomic::AtomicU64::new(0),
            },
        }
    }

    /// The same limits kept in `store`, shared by every replica. `scope` (`peer`, `tool`)
    /// keeps the key spaces of different limits apart in the store.
    pub fn shared(
        scope: &'static str,
        default: Option<Rate>,
        overrides: impl IntoIterator<Item = (String, Rate)>,
        store: Arc<dyn SharedLimits>,
    ) -> Self {
        KeyedLimits {
            backend: Backend::Shared {
                scope,
                default,
                overrides: overrides.into_iter().collect(),
                store,
            },
        }
    }

    /// Whether `key` has a limit (its own or the default): whether [`check`](Self::check)
    /// takes a cell for it.
    pub fn limits(&self, key: &str) -> bool {
        match &self.backend {
            Backend::Local {
                default, overrides, ..
            } => default.is_some() || overrides.contains_key(key),
            Backend::Shared {
                default, overrides, ..
            } => default.is_some() || overrides.contains_key(key),
        }
    }

    /// Take one cell for `key`, or say how long until one is available.
    pub fn check(&self, key: &str) -> LimitCheck {
        match &self.backend {
            Backend::Local {
                default,
                overrides,
                clock,
                checks,
            } => {
                let n = checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n % RETAIN_EVERY == RETAIN_EVERY - 1 {
                    // Forget keys whose state is back to full.
                    if let Some(l) = default {
                        l.retain_recent();
                    }
                    for l in overrides.values() {
                        l.retain_recent();
                    }
                }
                let limiter = match overrides.get(key).or(default.as_ref()) {
                    Some(l) => l,
                    None => return LimitCheck::Allowed,
                };
                // Keyed limiters take a reference to an owned key and copy it only to add it.
                match KEY.with_borrow_mut(|owned| {
                    owned.clear();
                    owned.push_str(key);
                    limiter.check_key(owned)
                }) {
                    Ok(()) => LimitCheck::Allowed,
                    Err(not_until) => LimitCheck::Wait(not_until.wait_time_from(clock.now())),
                }
            }
            Backend::Shared {
                scope,
                default,
                overrides,
                store,
            } => {
                let Some(rate) = overrides.get(key).or(default.as_ref()) else {
                    return LimitCheck::Allowed;
                };
                let take = store.take(&format!("{scope}:{key}"), *rate);
                let scope = *scope;
                LimitCheck::Pending(Box::pin(async move {
                    match take.await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(wait)) => Err(rate_limited(scope, wait)),
                        Err(e) => Err(Rejection::SharedStateUnavailable(e.0)),
                    }
                }))
            }
        }
    }
}

impl LimitCheck {
    /// The answer for a limit of `scope` (`peer`, `tool`): `Ok(None)` when a cell was taken,
    /// `Ok(Some(check))` when the shared store decides, the refusal otherwise.
    pub fn decide(
        self,
        scope: &'static str,
    ) -> Result<Option<BoxFuture<Result<(), Rejection>>>, Rejection> {
        match self {
            LimitCheck::Allowed => Ok(None),
            LimitCheck::Wait(wait) => Err(rate_limited(scope, wait)),
            LimitCheck::Pending(check) => Ok(Some(check)),
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
    S: Service<http::Request<B>, Error = Rejection> + Clone,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = Gated<S, http::Request<B>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(principal) = req.extensions().get::<Arc<Principal>>() else {
            // The identity layer runs first; a request without a principal is a wiring bug.
            return Gated::reject(Rejection::Internal("request without principal".into()));
        };
        match self.limits.check(&principal.rate_limit_key()) {
            LimitCheck::Allowed => Gated::inner(self.inner.call(req)),
            LimitCheck::Wait(wait) => Gated::reject(rate_limited("peer", wait)),
            LimitCheck::Pending(check) => {
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                Gated::checking(check, ready, req)
            }
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
    S: Service<ToolCall, Error = Rejection> + Clone,
{
    type Response = S::Response;
    type Error = Rejection;
    type Future = Gated<S, ToolCall, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        match self.limits.check(&call.tool.name) {
            LimitCheck::Allowed => Gated::inner(self.inner.call(call)),
            LimitCheck::Wait(wait) => Gated::reject(rate_limited("tool", wait)),
            LimitCheck::Pending(check) => {
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                Gated::checking(check, ready, call)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The local answer as a `Result`.
    trait CheckNow {
        fn now(&self, key: &str) -> Result<(), Duration>;
    }

    impl CheckNow for KeyedLimits {
        fn now(&self, key: &str) -> Result<(), Duration> {
            match self.check(key) {
                LimitCheck::Allowed => Ok(()),
                LimitCheck::Wait(w) => Err(w),
                LimitCheck::Pending(_) => panic!("local limits answer at once"),
            }
        }
    }

    fn rate(per_second: u32, burst: u32) -> Rate {
        Rate::per(
            NonZeroU32::new(per_second).unwrap(),
            Duration::from_secs(1),
            NonZeroU32::new(burst).unwrap(),
        )
    }

    #[test]
    fn burst_then_refused_with_a_wait() {
        let l = KeyedLimits::new(Some(rate(1, 2)), []);
        assert!(l.now("a").is_ok());
        assert!(l.now("a").is_ok());
        let wait = l.now("a").unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        // Keys are independent.
        assert!(l.now("b").is_ok());
    }

    #[test]
    fn a_quota_per_minute_refuses_the_fourth_of_three_with_the_wait_to_the_next() {
        let three_a_minute = Rate::per(
            NonZeroU32::new(3).unwrap(),
            Duration::from_secs(60),
            NonZeroU32::new(3).unwrap(),
        );
        assert_eq!(three_a_minute.emission_interval(), Duration::from_secs(20));
        let l = KeyedLimits::new(Some(three_a_minute), []);
        for _ in 0..3 {
            assert!(l.now("a").is_ok());
        }
        let wait = l.now("a").unwrap_err();
        assert!(
            wait > Duration::from_secs(19) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
    }

    #[test]
    fn overrides_win_and_no_default_is_unlimited() {
        let l = KeyedLimits::new(None, [("slow".to_string(), rate(1, 1))]);
        for _ in 0..1000 {
            assert!(l.now("fast").is_ok());
        }
        assert!(l.now("slow").is_ok());
        assert!(l.now("slow").is_err());
        assert!(l.limits("slow") && !l.limits("fast"));
        let everyone = KeyedLimits::new(Some(rate(1, 1)), []);
        assert!(everyone.limits("fast"));
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        let r = rate_limited("peer", Duration::from_millis(10));
        assert_eq!(r.retry_after(), Some(Duration::from_secs(1)));
        let r = rate_limited("peer", Duration::from_millis(1500));
        assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
    }

    /// A shared store that allows `allow` takes per key, then asks to wait 1.5 s; or is down.
    struct FakeStore {
        asked: std::sync::Mutex<Vec<(String, Rate)>>,
        allow: usize,
        down: bool,
    }

    impl SharedLimits for FakeStore {
        fn take(
            &self,
            key: &str,
            rate: Rate,
        ) -> BoxFuture<Result<Result<(), Duration>, crate::shared::SharedStateError>> {
            let mut asked = self.asked.lock().unwrap();
            asked.push((key.to_owned(), rate));
            let n = asked.iter().filter(|(k, _)| k == key).count();
            let r = if self.down {
                Err(crate::shared::SharedStateError("timed out".into()))
            } else if n <= self.allow {
                Ok(Ok(()))
            } else {
                Ok(Err(Duration::from_millis(1500)))
            };
            Box::pin(async move { r })
        }
    }

    async fn shared_answer(l: &KeyedLimits, key: &str) -> Option<Result<(), Rejection>> {
        match l.check(key) {
            LimitCheck::Pending(f) => Some(f.await),
            LimitCheck::Allowed => None,
            LimitCheck::Wait(_) => panic!("shared limits never decide locally"),
        }
    }

    #[tokio::test]
    async fn shared_limits_ask_the_store_with_the_key_scope_and_rate() {
        let store = Arc::new(FakeStore {
            asked: Default::default(),
            allow: 1,
            down: false,
        });
        let l = KeyedLimits::shared(
            "tool",
            None,
            [("slow".to_string(), rate(2, 1))],
            store.clone(),
        );
        // No limit for this key: the store is not asked.
        assert!(shared_answer(&l, "free").await.is_none());
        assert!(matches!(shared_answer(&l, "slow").await, Some(Ok(()))));
        match shared_answer(&l, "slow").await {
            Some(Err(r @ Rejection::RateLimited { scope: "tool", .. })) => {
                assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            *store.asked.lock().unwrap(),
            vec![("tool:slow".to_string(), rate(2, 1)); 2]
        );
        assert_eq!(rate(2, 1).emission_interval(), Duration::from_millis(500));
    }

    #[tokio::test]
    async fn an_unreachable_store_refuses_the_call() {
        let store = Arc::new(FakeStore {
            asked: Default::default(),
            allow: 100,
            down: true,
        });
        let l = KeyedLimits::shared("peer", Some(rate(100, 100)), [], store);
        assert!(matches!(
            shared_answer(&l, "gw").await,
            Some(Err(Rejection::SharedStateUnavailable(_)))
        ));
    }
}
