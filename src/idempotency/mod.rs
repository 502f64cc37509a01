//! Idempotency at the shell: a call with an `idempotency_key` runs once per (caller, tenant,
//! memory scope, tool, key) within a window. A repeat gets the first call's stored answer (and receipt) without
//! reaching the app; a repeat while the first still runs waits for it, up to a bound; the
//! same key with other arguments is refused (`INVALID_ARGS`, reason `idempotency_conflict`).
//!
//! Keys live where nonces do: in this process ([`LocalKeys`]) or in Redis for replicas. A
//! success, or an error the app reported that is not retryable, is kept; a retryable error,
//! a timeout or a refusal frees the key, so a retry runs again. An answer larger than
//! `max_result_bytes` is not kept (a repeat runs again).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};
use sha2::Digest as _;
use tower::{Layer, Service};

pub mod answer;
pub mod store;

pub use store::{IdempotencyStore, LocalKeys, Slot};

use crate::receipts::{value_hash, ReceiptNote, ReceiptSlot};

/// How the layer decides and waits.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a finished call's answer is kept.
    pub window: Duration,
    /// How long a repeat waits for the first call to finish.
    pub wait: Duration,
    /// Larger answers are not kept.
    pub max_result_bytes: usize,
    /// Per-tool choices (`tools.<name>.idempotency`); a tool not named is covered when it
    /// declares side effects.
    pub tools: BTreeMap<String, bool>,
}

/// The longest key accepted.
pub const MAX_KEY_BYTES: usize = 255;

/// Runs each keyed call once, as the module says.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use carapace::idempotency::{IdempotencyLayer, LocalKeys, Settings};
///
/// let layer = IdempotencyLayer::new(
///     Arc::new(LocalKeys::new(10_000, 16 << 20)),
///     Settings {
///         window: Duration::from_secs(3600),
///         wait: Duration::from_secs(30),
///         max_result_bytes: 256 * 1024,
///         tools: Default::default(),
///     },
/// );
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    keys: Arc<dyn IdempotencyStore>,
    settings: Arc<Settings>,
}

impl IdempotencyLayer {
    pub fn new(keys: Arc<dyn IdempotencyStore>, settings: Settings) -> Self {
        IdempotencyLayer {
            keys,
            settings: Arc::new(settings),
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Idempotent {
            inner,
            layer: self.clone(),
        }
    }
}

/// Service of [`IdempotencyLayer`].
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    layer: IdempotencyLayer,
}

/// The store key of (caller, tenant, memory scope, tool, key): hashed, so that any key text is
/// safe in it. The tenant (`tenant_id`) and the memory scope (`context.isolation_key`) go to
/// the app with the call, so two calls that differ in them are two calls, whatever their key.
fn store_key(call: &ToolCall, key: &str) -> String {
    let mut h = sha2::Sha256::new();
    let scope = call
        .context
        .as_ref()
        .and_then(|c| c.member("isolation_key"));
    let caller = call.principal.limit_key();
    let parts = [Some(caller.as_ref()), Some(&*call.tool.name), Some(key)];
    let scoped = [call.tenant_id.as_deref(), scope.as_deref()];
    // Without a tenant and a scope the key is what it was before they counted, so replicas of
    // both versions agree on it during a rolling upgrade.
    let scoped = match scoped.iter().any(Option::is_some) {
        true => &scoped[..],
        false => &[],
    };
    for part in parts.iter().chain(scoped).copied() {
        match part {
            Some(p) => {
                h.update((p.len() as u64).to_be_bytes());
                h.update(p.as_bytes());
            }
            // Absent, told from an empty string.
            None => h.update(u64::MAX.to_be_bytes()),
        }
    }
    format!("idem:{}", hex::encode(h.finalize()))
}

/// A key is 1 to 255 visible ASCII characters.
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_BYTES).contains(&key.len()) && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

impl<S> Service<ToolCall> for Idempotent<S>
where
    S: Service<ToolCall, Response = CallOutcome, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        let settings = &self.layer.settings;
        let covered = call.idempotency_key.is_some()
            && settings
                .tools
                .get(&call.tool.name)
                .copied()
                .unwrap_or(call.tool.side_effects);
        if !covered {
            return Box::pin(self.inner.call(call));
        }
        // The inner service was made ready for this call; a clone takes its place.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(run(inner, self.layer.clone(), call))
    }
}

/// Frees a claimed key if the call is dropped before it ends (cancelled, timed out above).
struct Claim {
    keys: Arc<dyn IdempotencyStore>,
    key: String,
    token: String,
    args_hash: String,
    window: Duration,
    done: bool,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let fut = self
            .keys
            .finish(&self.key, &self.token, &self.args_hash, None, self.window);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = fut.await;
            });
        }
    }
}

async fn run<S>(
    mut inner: S,
    layer: IdempotencyLayer,
    call: ToolCall,
) -> Result<CallOutcome, Rejection>
where
    S: Service<ToolCall, Response = CallOutcome, Error = Rejection>,
{
    let settings = layer.settings.clone();
    let key_text = call.idempotency_key.as_deref().unwrap_or_default();
    if !valid_key(key_text) {
        return Err(Rejection::InvalidRequest {
            message: "idempotency_key must be 1 to 255 visible ASCII characters".into(),
            path: Some("/idempotency_key".into()),
        });
    }
    let key = store_key(&call, key_text);
    let args_hash = value_hash(&call.args);
    let token = hex::encode(rand::random::<[u8; 8]>());
    let slot = call.extensions.get::<ReceiptSlot>().cloned();
    // A running claim outlives the call's own timeout only a little: a crashed replica does
    // not hold the key for the whole window.
    let running_ttl = (call.tool.effective_timeout(call.timeout_ms) + Duration::from_secs(5))
        .min(settings.window);
    if let Some(outcome) = claim_or_answer(&layer, &key, &args_hash, &token, running_ttl).await? {
        if let Some(slot) = &slot {
            slot.fill(outcome.1);
        }
        tracing::info!(call_id = %call.call_id, tool = %call.tool.name, "idempotent repeat answered from the store");
        return Ok(outcome.0);
    }
    let mut claim = Claim {
        keys: layer.keys.clone(),
        key,
        token,
        args_hash,
        window: settings.window,
        done: false,
    };
    let result = std::future::poll_fn(|cx| inner.poll_ready(cx)).await;
    let result = match result {
        Ok(()) => inner.call(call).await,
        Err(e) => Err(e),
    };
    let kept = match &result {
        Ok(outcome) if answer::storable(outcome) => {
            let receipt = slot
                .as_ref()
                .and_then(ReceiptSlot::get)
                .and_then(|n| n.encoded.as_ref())
                .and_then(|v| v.to_str().ok());
            Some(answer::encode(outcome, receipt)).filter(|a| a.len() <= settings.max_result_bytes)
        }
        _ => None,
    };
    claim.done = true;
    if let Err(e) = layer
        .keys
        .finish(
            &claim.key,
            &claim.token,
            &claim.args_hash,
            kept,
            claim.window,
        )
        .await
    {
        tracing::warn!("idempotency key not finished: {e}");
    }
    result
}

/// Claim `key` for this call (`None`: it runs), or the first call's stored answer with its
/// receipt; a repeat while the first call runs waits for it, up to the configured wait.
async fn claim_or_answer(
    layer: &IdempotencyLayer,
    key: &str,
    args_hash: &str,
    token: &str,
    running_ttl: Duration,
) -> Result<Option<(CallOutcome, ReceiptNote)>, Rejection> {
    let deadline = tokio::time::Instant::now() + layer.settings.wait;
    let mut pause = Duration::from_millis(5);
    loop {
        match layer.keys.claim(key, args_hash, token, running_ttl).await? {
            Slot::Claimed => return Ok(None),
            Slot::Running { args_hash: h } | Slot::Done { args_hash: h, .. } if h != args_hash => {
                return Err(Rejection::IdempotencyConflict);
            }
            Slot::Done { answer, .. } => {
                let (outcome, receipt) = answer::decode(&answer)
                    .ok_or_else(|| Rejection::Internal("a stored answer is unreadable".into()))?;
                let note = ReceiptNote {
                    encoded: receipt.and_then(|r| http::HeaderValue::from_str(&r).ok()),
                    receipt: None,
                    status: None,
                };
                return Ok(Some((outcome, note)));
            }
            Slot::Running { .. } => {
                if tokio::time::Instant::now() + pause > deadline {
                    return Err(Rejection::IdempotencyPending);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests;
