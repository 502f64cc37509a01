//! Metering: a price per tool, a budget per consumer. A priced call is held against its
//! caller's budget when it starts, refused before the app when the budget cannot pay
//! (`FORBIDDEN`, `details.reason: budget_exhausted`), and charged when it succeeds or released
//! when it fails. Charges are recorded with the call's ledger row and receipt; what each
//! consumer spent is kept in the ledger's database, so budgets hold across restarts.
//! Settlement elsewhere (a chain, a billing system) plugs in as a [`Settlement`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::signature::UnixClock;
use carapace_filters::{BoxFuture, Rejection};
use tower::{Layer, Service};

use crate::config::BudgetConfig;
use crate::ledger::store::day_of;

/// Put in a call's extensions by the metering layer: its price. The ledger records it as the
/// row's `charge` when the call succeeded (0 otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priced(pub u64);

/// One charge, as a settlement backend gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub call_id: String,
    pub consumer: String,
    pub tool: String,
    pub amount: u64,
    pub at_ms: u64,
}

/// Where charges go beyond the ledger. Called after the call's answer, never on its path.
pub trait Settlement: Send + Sync {
    fn settle(&self, charge: Charge) -> BoxFuture<Result<(), String>>;
}

/// No settlement: the ledger is the record.
pub struct LedgerOnly;

impl Settlement for LedgerOnly {
    fn settle(&self, _: Charge) -> BoxFuture<Result<(), String>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    total: u64,
    day: u64,
    today: u64,
    held: u64,
}

/// What each consumer spent and holds.
pub struct Meter {
    spent: Mutex<HashMap<String, Spent>>,
    settlement: Arc<dyn Settlement>,
}

impl Meter {
    /// From what the ledger says each consumer spent: (consumer, total, today) on `day`.
    pub fn new(spend: &[(String, u64, u64)], day: u64, settlement: Arc<dyn Settlement>) -> Self {
        let spent = spend
            .iter()
            .map(|(c, total, today)| {
                (
                    c.clone(),
                    Spent {
                        total: *total,
                        day,
                        today: *today,
                        held: 0,
                    },
                )
            })
            .collect();
        Meter {
            spent: Mutex::new(spent),
            settlement,
        }
    }

    /// Hold `price` against `consumer`'s `budget`, or refuse.
    fn hold(
        &self,
        consumer: &str,
        budget: &BudgetConfig,
        price: u64,
        now_ms: u64,
    ) -> Result<(), Rejection> {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        let s = spent.entry(consumer.to_string()).or_default();
        let day = day_of(now_ms);
        if s.day != day {
            s.day = day;
            s.today = 0;
        }
        let limits = [
            ("per_day", budget.per_day, s.today),
            ("total", budget.total, s.total),
        ];
        for (period, limit, used) in limits {
            let Some(limit) = limit else { continue };
            let remaining = limit.saturating_sub(used + s.held);
            if price > remaining {
                return Err(Rejection::BudgetExhausted {
                    consumer: consumer.to_string(),
                    period,
                    remaining,
                    price,
                });
            }
        }
        s.held += price;
        Ok(())
    }

    /// The held `price` is charged (`charged`) or released.
    fn end(&self, consumer: &str, price: u64, charged: bool, now_ms: u64) {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        let s = spent.entry(consumer.to_string()).or_default();
        s.held = s.held.saturating_sub(price);
        if charged {
            let day = day_of(now_ms);
            if s.day != day {
                s.day = day;
                s.today = 0;
            }
            s.today += price;
            s.total += price;
        }
    }

    /// What `consumer` has spent: (total, today).
    pub fn spent(&self, consumer: &str) -> (u64, u64) {
        let spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        spent.get(consumer).map_or((0, 0), |s| (s.total, s.today))
    }
}

/// The prices and budgets of one configuration.
#[derive(Debug, Clone, Default)]
pub struct Prices {
    /// Price per tool (tools not named are free).
    pub tools: HashMap<String, u64>,
    /// Budget per consumer; `default` for consumers not named (none: unlimited).
    pub budgets: HashMap<String, BudgetConfig>,
    pub default: Option<BudgetConfig>,
}

/// Holds, charges and refuses priced calls.
///
/// ```
/// use std::sync::Arc;
/// use carapace::metering::{LedgerOnly, Meter, MeteringLayer, Prices};
///
/// let meter = Arc::new(Meter::new(&[], 0, Arc::new(LedgerOnly)));
/// let layer = MeteringLayer::new(meter, Prices::default(), Arc::new(carapace_filters::unix_now_ms));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct MeteringLayer {
    meter: Arc<Meter>,
    prices: Arc<Prices>,
    clock: UnixClock,
}

impl MeteringLayer {
    pub fn new(meter: Arc<Meter>, prices: Prices, clock: UnixClock) -> Self {
        MeteringLayer {
            meter,
            prices: Arc::new(prices),
            clock,
        }
    }
}

impl<S> Layer<S> for MeteringLayer {
    type Service = Metered<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Metered {
            inner,
            layer: self.clone(),
        }
    }
}

/// Service of [`MeteringLayer`].
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    layer: MeteringLayer,
}

impl<S> Service<ToolCall> for Metered<S>
where
    S: Service<ToolCall, Response = CallOutcome, Error = Rejection>,
    S::Future: Send + 'static,
{
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: ToolCall) -> Self::Future {
        let prices = &self.layer.prices;
        let Some(price) = prices.tools.get(&call.tool.name).copied() else {
            return Box::pin(self.inner.call(call));
        };
        let consumer = call.principal.id.to_string();
        let budget = prices.budgets.get(&consumer).or(prices.default.as_ref());
        let now = (self.layer.clock)();
        if let Some(budget) = budget {
            if let Err(r) = self.layer.meter.hold(&consumer, budget, price, now) {
                return Box::pin(std::future::ready(Err(r)));
            }
        }
        let mut hold = Hold {
            layer: self.layer.clone(),
            budgeted: budget.is_some(),
            consumer,
            price,
            call_id: call.call_id.to_string(),
            tool: call.tool.name.clone(),
            ended: false,
        };
        call.extensions.insert(Priced(price));
        let fut = self.inner.call(call);
        Box::pin(async move {
            let result = fut.await;
            hold.end(charged(&result));
            result
        })
    }
}

/// Whether a call that ended with `result` is charged: when it succeeded, and when its outcome
/// is not known (it timed out: the app may have run it). A budget caps what a consumer may
/// have used.
pub fn charged(result: &Result<CallOutcome, Rejection>) -> bool {
    matches!(
        result,
        Ok(CallOutcome::Ok { .. }) | Err(Rejection::Timeout(_))
    )
}

/// A priced call under way: its price held against the consumer's budget (when it has one),
/// charged or released when it ends. A call dropped before it ends (cancelled, or its caller
/// gone) is charged: the app may have run it.
struct Hold {
    layer: MeteringLayer,
    budgeted: bool,
    consumer: String,
    price: u64,
    call_id: String,
    tool: String,
    ended: bool,
}

impl Hold {
    fn end(&mut self, charged: bool) {
        self.ended = true;
        let now = (self.layer.clock)();
        if self.budgeted {
            self.layer
                .meter
                .end(&self.consumer, self.price, charged, now);
        }
        if !charged || self.price == 0 {
            return;
        }
        let settle = self.layer.meter.settlement.settle(Charge {
            call_id: std::mem::take(&mut self.call_id),
            consumer: std::mem::take(&mut self.consumer),
            tool: std::mem::take(&mut self.tool),
            amount: self.price,
            at_ms: now,
        });
        // A call dropped as the runtime stops has no runtime to settle on: its charge is in
        // the ledger, which is the record.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = settle.await {
                    tracing::warn!("settlement failed: {e}");
                }
            });
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.ended {
            self.end(true);
        }
    }
}

#[cfg(test)]
mod tests;
