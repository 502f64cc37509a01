//! The inbound side's receipt: every call that got past the caller's checks (authorization,
//! signature, input schema) and ended, whichever way, is signed.

use std::sync::Arc;
use std::task::{Context, Poll};

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::signature::UnixClock;
use carapace_filters::{BoxFuture, Rejection};
use serde_json::Value;
use tower::{Layer, Service};

use super::batch::{BatchCounters, BatchQueue, Started};
use super::{
    new_receipt_id, output_hash, rfc3339_ms, value_hash, Receipt, ReceiptNote, ReceiptSlot,
    ReceiptStatus,
};
use crate::pairing::wire::SigningIdentity;

/// The tool host's signing key, its component id (the receipts' `provider`), and whether it
/// signs each receipt alone (`v1`) or in batches (`v2`).
pub struct ReceiptSigner {
    key: SigningIdentity,
    provider: String,
    batches: Option<BatchQueue>,
}

impl ReceiptSigner {
    /// Each receipt signed alone: the `v1` form.
    pub fn new(key: SigningIdentity, provider: String) -> Self {
        ReceiptSigner {
            key,
            provider,
            batches: None,
        }
    }

    /// The receipts that end together signed as one batch: the `v2` form ([`super::batch`]).
    pub fn batched(key: SigningIdentity, provider: String) -> Self {
        ReceiptSigner {
            batches: Some(BatchQueue::default()),
            ..Self::new(key, provider)
        }
    }

    /// Batches counted into `counters` (a signer that signs each receipt alone has none).
    pub fn counting(mut self, counters: Arc<BatchCounters>) -> Self {
        if self.batches.is_some() {
            self.batches = Some(BatchQueue::counting(counters));
        }
        self
    }

    /// The receipts' `provider`.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// A call's receipt, started with the call and signed when it ends.
    pub fn start(self: Arc<Self>) -> ReceiptCall {
        let started = self.batches.as_ref().map(BatchQueue::start);
        ReceiptCall {
            signer: self,
            started,
        }
    }
}

/// One call's receipt, from the call's start to its signature. Until it is signed (or
/// dropped) the call counts as under way, so a batch's leader waits a turn for it
/// ([`super::batch`]).
pub struct ReceiptCall {
    signer: Arc<ReceiptSigner>,
    started: Option<Started>,
}

impl ReceiptCall {
    /// The receipts' `provider`.
    pub fn provider(&self) -> &str {
        &self.signer.provider
    }

    /// The `Carapace-Receipt` value of `receipt`.
    pub async fn sign(mut self, receipt: &Receipt) -> Option<String> {
        let signer = &self.signer;
        match (&signer.batches, self.started.take()) {
            (Some(batches), Some(started)) => {
                batches
                    .sign(&signer.key, receipt.canonical(), started)
                    .await
            }
            _ => Some(receipt.encode(&signer.key)),
        }
    }
}

impl Drop for ReceiptCall {
    fn drop(&mut self) {
        if let (Some(batches), Some(started)) = (&self.signer.batches, self.started.take()) {
            batches.abandon(started);
        }
    }
}

/// How a call ended, in a receipt's terms: status, the output of a success, the error code
/// of a failure.
pub fn ending(
    result: &Result<CallOutcome, Rejection>,
) -> (ReceiptStatus, Option<&Value>, Option<&str>) {
    match result {
        Ok(CallOutcome::Ok { output, .. }) => (ReceiptStatus::Ok, Some(output), None),
        Ok(CallOutcome::AppError { code, .. }) => (ReceiptStatus::Error, None, Some(code.as_str())),
        Err(Rejection::Timeout(_)) => (ReceiptStatus::Timeout, None, Some("TIMEOUT")),
        Err(r) => (
            ReceiptStatus::Error,
            None,
            Some(crate::errors::tools_v1(r).0),
        ),
    }
}

/// Signs a receipt for every call and leaves it in the call's [`ReceiptSlot`].
///
/// ```
/// use std::sync::Arc;
/// use carapace::pairing::wire::SigningIdentity;
/// use carapace::receipts::{ReceiptLayer, ReceiptSigner};
///
/// let (key, _seed) = SigningIdentity::generate();
/// let signer = Arc::new(ReceiptSigner::batched(key, "memory-host".into()));
/// let layer = ReceiptLayer::new(signer, Arc::new(carapace_filters::unix_now_ms));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct ReceiptLayer {
    signer: Arc<ReceiptSigner>,
    clock: UnixClock,
}

impl ReceiptLayer {
    pub fn new(signer: Arc<ReceiptSigner>, clock: UnixClock) -> Self {
        ReceiptLayer { signer, clock }
    }
}

impl<S> Layer<S> for ReceiptLayer {
    type Service = Receipts<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Receipts {
            inner,
            layer: self.clone(),
        }
    }
}

/// Service of [`ReceiptLayer`].
#[derive(Clone)]
pub struct Receipts<S> {
    inner: S,
    layer: ReceiptLayer,
}

impl<S> Service<ToolCall> for Receipts<S>
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
        let Some(slot) = call.extensions.get::<ReceiptSlot>().cloned() else {
            return Box::pin(self.inner.call(call));
        };
        let executed_at = (self.layer.clock)();
        let started = carapace_filters::clock::now();
        let input_hash = value_hash(&call.args);
        let tool = call.tool.name.clone();
        let consumer = call.principal.id.to_string();
        let signing = self.layer.signer.clone().start();
        let fut = self.inner.call(call);
        Box::pin(async move {
            let result = fut.await;
            let (status, output, code) = ending(&result);
            let receipt = Receipt {
                receipt_id: new_receipt_id(),
                tool,
                consumer,
                provider: signing.provider().to_owned(),
                input_hash,
                output_hash: output_hash(status, output, code),
                status,
                executed_at: rfc3339_ms(executed_at),
                duration_ms: carapace_filters::clock::elapsed(started).as_millis() as u64,
            };
            let encoded = signing.sign(&receipt).await;
            slot.fill(ReceiptNote {
                encoded: encoded.and_then(|e| http::HeaderValue::try_from(e).ok()),
                receipt: Some(receipt),
                status: None,
            });
            result
        })
    }
}
