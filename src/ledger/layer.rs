//! Records every call that passes through into the ledger, after it ends.

use std::sync::Arc;
use std::task::{Context, Poll};

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::signature::UnixClock;
use carapace_filters::{BoxFuture, Rejection};
use tower::{Layer, Service};

use super::record::{Ending, Record, Started};
use super::{Ledger, Place};
use crate::receipts::layer::ending;
use crate::receipts::{output_tag, value_tag, ReceiptSlot, Tag};

/// Who executes a call, as the ledger names it (the host itself, or the peer a gateway routes
/// the tool to).
pub type ProviderOf = Arc<dyn Fn(&ToolCall) -> Arc<str> + Send + Sync>;

/// Queues a ledger [`Record`] for every call when it ends: its hashes come from the call's
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
///     Arc::new(|_| "memory-host".into()),
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
            layer: Arc::new(self.clone()),
        }
    }
}

/// Service of [`LedgerLayer`].
#[derive(Clone)]
pub struct Recorded<S> {
    inner: S,
    /// Shared: a call takes one reference, not one per part of the layer.
    layer: Arc<LedgerLayer>,
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
        let started = carapace_filters::clock::now();
        let slot = call.extensions.get::<ReceiptSlot>().cloned();
        let price = call
            .extensions
            .get::<crate::metering::Priced>()
            .map(|p| p.0);
        // The input's hash comes from the receipt when a receipt layer below signs the call.
        let input = match slot.is_some() && layer.signed_below {
            true => None,
            false => Some(value_tag(&call.args)),
        };
        let provider = (layer.provider)(&call);
        let record = Record::start(
            layer.side,
            &call.call_id,
            &call.tool.name,
            &call.principal.id,
            &provider,
            input.as_ref().map(Tag::as_str),
            (layer.clock)(),
        );
        let mut pending = Pending {
            layer,
            record: Some(record),
            reserved,
            started,
            price,
        };
        let fut = self.inner.call(call);
        Box::pin(async move {
            let result = fut.await;
            let (status, output, code) = ending(&result);
            let note = slot.as_ref().and_then(ReceiptSlot::get);
            let receipt = note.and_then(|n| n.receipt.as_ref());
            let computed;
            let output_hash = match receipt {
                Some(r) => r.output_hash.as_str(),
                None => {
                    computed = output_tag(status, output, code);
                    computed.as_str()
                }
            };
            pending.end(Ending {
                receipt_id: receipt.map(|r| r.receipt_id.as_str()),
                input_hash: receipt.map(|r| r.input_hash.as_str()),
                output_hash,
                status: status.as_str(),
                error_code: code,
                ended_at: 0,
                duration_ms: 0,
                receipt: note
                    .and_then(|n| n.encoded.as_ref())
                    .and_then(|v| v.to_str().ok()),
                charge: pending
                    .price
                    .map(|p| p * u64::from(crate::metering::charged(&result))),
            });
            result
        })
    }
}

/// A started call's record, written when the call ends, or as `CANCELLED` when its future is
/// dropped first (the caller cancelled it or went away; the app may have run it, so a priced
/// call is charged): an accepted call is always recorded.
struct Pending {
    layer: Arc<LedgerLayer>,
    record: Option<Started>,
    reserved: Option<Place>,
    started: tokio::time::Instant,
    price: Option<u64>,
}

impl Pending {
    /// Queue the record with `ending` (its end time and duration taken now).
    fn end(&mut self, ending: Ending<'_>) {
        let Some(record) = self.record.take() else {
            return;
        };
        let entry = record.end(Ending {
            ended_at: (self.layer.clock)(),
            duration_ms: carapace_filters::clock::elapsed(self.started).as_millis() as u64,
            ..ending
        });
        self.layer.ledger.record(entry, self.reserved.take());
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.record.is_none() {
            return;
        }
        let (status, code) = (crate::receipts::ReceiptStatus::Error, "CANCELLED");
        let output = output_tag(status, None, Some(code));
        self.end(Ending {
            receipt_id: None,
            input_hash: None,
            output_hash: output.as_str(),
            status: status.as_str(),
            error_code: Some(code),
            ended_at: 0,
            duration_ms: 0,
            receipt: None,
            // Charged, as metering charges a call dropped before it ended.
            charge: self.price,
        });
    }
}
