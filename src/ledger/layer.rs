//! Records every call that passes through into the ledger, after it ends.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::signature::UnixClock;
use carapace_filters::{BoxFuture, Rejection};
use tower::{Layer, Service};

use super::{Entry, Ledger};
use crate::receipts::layer::ending;
use crate::receipts::{output_hash, value_hash, ReceiptSlot};

/// Who executes a call, as the ledger names it (the host itself, or the peer a gateway routes
/// the tool to).
pub type ProviderOf = Arc<dyn Fn(&ToolCall) -> String + Send + Sync>;

/// Queues a ledger [`Entry`] for every call when it ends: its hashes come from the call's
/// receipt when the stage below signed or verified one.
///
/// ```
/// use std::sync::Arc;
/// use carapace::config::LedgerConfig;
/// use carapace::ledger::{Ledger, LedgerLayer};
///
/// let dir = tempfile::tempdir().unwrap();
/// let ledger = Ledger::open(
///     &dir.path().join("ledger.sqlite3"),
///     &LedgerConfig::default(),
///     Arc::default(),
/// )
/// .unwrap();
/// let layer = LedgerLayer::new(
///     Arc::new(ledger),
///     "inbound",
///     Arc::new(|_| "memory-host".to_string()),
///     Arc::new(carapace_filters::unix_now_ms),
/// );
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct LedgerLayer {
    ledger: Arc<Ledger>,
    side: &'static str,
    provider: ProviderOf,
    clock: UnixClock,
    /// A receipt layer below signs every call, so its hashes are taken from the receipt.
    signed_below: bool,
}

impl LedgerLayer {
    pub fn new(
        ledger: Arc<Ledger>,
        side: &'static str,
        provider: ProviderOf,
        clock: UnixClock,
    ) -> Self {
        LedgerLayer {
            ledger,
            side,
            provider,
            clock,
            signed_below: false,
        }
    }

    /// A [`crate::receipts::ReceiptLayer`] is below: the receipt's hashes are used.
    pub fn over_receipts(mut self) -> Self {
        self.signed_below = true;
        self
    }
}

impl<S> Layer<S> for LedgerLayer {
    type Service = Recorded<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Recorded {
            inner,
            layer: self.clone(),
        }
    }
}

/// Service of [`LedgerLayer`].
#[derive(Clone)]
pub struct Recorded<S> {
    inner: S,
    layer: LedgerLayer,
}

impl<S> Service<ToolCall> for Recorded<S>
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

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let Ok(reserved) = self.layer.ledger.reserve() else {
            return Box::pin(std::future::ready(Err(Rejection::SharedStateUnavailable(
                "the ledger's queue is full".into(),
            ))));
        };
        let layer = self.layer.clone();
        let started_at = (layer.clock)();
        let started = Instant::now();
        let slot = call.extensions.get::<ReceiptSlot>().cloned();
        let price = call
            .extensions
            .get::<crate::metering::Priced>()
            .map(|p| p.0);
        let input_hash = match slot.is_some() && layer.signed_below {
            true => String::new(),
            false => value_hash(&call.args),
        };
        let mut entry = Entry {
            side: layer.side.to_string(),
            call_id: call.call_id.clone(),
            receipt_id: None,
            tool: call.tool.name.clone(),
            consumer: call.principal.id.clone(),
            provider: (layer.provider)(&call),
            input_hash,
            output_hash: String::new(),
            status: String::new(),
            error_code: None,
            started_at,
            ended_at: 0,
            duration_ms: 0,
            receipt: None,
            charge: None,
        };
        let fut = self.inner.call(call);
        Box::pin(async move {
            let result = fut.await;
            let (status, output, code) = ending(&result);
            entry.status = status.as_str().into();
            entry.charge = price.map(|p| match status {
                crate::receipts::ReceiptStatus::Ok => p,
                _ => 0,
            });
            entry.error_code = code.map(str::to_string);
            entry.ended_at = (layer.clock)();
            entry.duration_ms = started.elapsed().as_millis() as u64;
            let note = slot.as_ref().and_then(ReceiptSlot::get);
            match note.and_then(|n| n.receipt.as_ref()) {
                Some(r) => {
                    entry.receipt_id = Some(r.receipt_id.clone());
                    entry.input_hash = r.input_hash.clone();
                    entry.output_hash = r.output_hash.clone();
                }
                None => entry.output_hash = output_hash(status, output, code),
            }
            entry.receipt = note
                .and_then(|n| n.encoded.as_ref())
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            layer.ledger.record(entry, reserved);
            result
        })
    }
}
