//! The call-stage stack as the fronts hold it: a copy per started call, kept for the next one
//! by the worker that started it.

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll};

use futures_util::FutureExt;
use tower::{Service, ServiceExt};

use carapace_filters::call::{CallOutcome, ToolCall};
use carapace_filters::{BoxFuture, Rejection};

#[cfg(doc)]
use crate::receipts::ReceiptSlot;

/// The call-stage stack a front hands decoded calls to, and which calls a layer of it (or its
/// back) may sign, check, store or read a receipt for: only those get a [`ReceiptSlot`].
///
/// `Service::call` takes the stack by `&mut`, so a call needs a copy of its own for the moment
/// it is started; copying the whole stack for every call (and dropping the copy) was most of a
/// thousand instructions. A copy that started a call is kept for the next one instead, by the
/// worker that started it: each worker has its own spare copies (see [`CallStack::for_workers`]),
/// so workers on different cores share no lock for them.
#[derive(Clone)]
pub struct CallStack {
    service: CallService,
    spare: Arc<[SpareCopies]>,
    receipts: ReceiptUse,
}

/// One worker's spare copies of a stack, on a cache line of its own.
#[derive(Default)]
#[repr(align(128))]
struct SpareCopies(Mutex<Vec<CallService>>);

type CallService = tower::util::BoxCloneSyncService<ToolCall, CallOutcome, Rejection>;

/// Copies of a stack kept for one worker's next calls, at most (a copy is back as soon as its
/// call has started, so about one is in use).
const SPARE_COPIES: usize = 16;

/// Which calls of a [`CallStack`] have a use for a receipt slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReceiptUse {
    EveryCall,
    /// Only a call with an idempotency key: its stored answer keeps its receipt.
    KeyedCalls,
    None,
}

impl CallStack {
    /// `service` as a call stack whose layers may use any call's receipt slot.
    pub fn new<S>(service: S) -> Self
    where
        S: Service<ToolCall, Response = CallOutcome, Error = Rejection>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        CallStack {
            service: tower::util::BoxCloneSyncService::new(service),
            spare: Arc::from([SpareCopies::default()]),
            receipts: ReceiptUse::EveryCall,
        }
    }

    /// Spare copies kept apart for each of `workers` workers (one set for all by default).
    pub fn for_workers(mut self, workers: usize) -> Self {
        self.spare = (0..workers.max(1))
            .map(|_| SpareCopies::default())
            .collect();
        self
    }

    /// No layer of this stack signs or checks receipts; its idempotency layer, when
    /// `keyed_answers`, stores and replays them with the answers of calls with a key.
    pub fn without_receipts(mut self, keyed_answers: bool) -> Self {
        self.receipts = match keyed_answers {
            true => ReceiptUse::KeyedCalls,
            false => ReceiptUse::None,
        };
        self
    }

    /// Whether `call` goes with a receipt slot.
    pub(super) fn has_receipt(&self, call: &ToolCall) -> bool {
        match self.receipts {
            ReceiptUse::EveryCall => true,
            ReceiptUse::KeyedCalls => call.idempotency_key.is_some(),
            ReceiptUse::None => false,
        }
    }

    /// The calling worker's spare copies, unless they are in use: by this thread further up
    /// (a layer that starts a call on the same stack) or by another worker that shares them.
    fn spare(&self) -> Option<MutexGuard<'_, Vec<CallService>>> {
        let i = crate::server::worker_index() % self.spare.len();
        match self.spare[i].0.try_lock() {
            Ok(spare) => Some(spare),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Start `call` on a copy of the stack: a kept one when there is one. Every layer is ready
    /// at once (limits are taken in `call`); should one not be, the call waits for it on its
    /// copy, which is then not kept. The layers' `call` runs here, not when the returned future
    /// is first polled, and the stack as a `Service` is always ready: readiness is each copy's.
    /// The spare copies stay locked while the call starts, so a call takes and gives back a
    /// copy under one lock.
    pub fn start(&self, call: ToolCall) -> BoxFuture<Result<CallOutcome, Rejection>> {
        let mut spare = self.spare();
        let kept = spare.as_mut().and_then(|spare| spare.pop());
        let mut copy = kept.unwrap_or_else(|| self.service.clone());
        match copy.ready().now_or_never() {
            Some(Ok(svc)) => {
                let started = svc.call(call);
                if let Some(spare) = spare.as_mut().filter(|s| s.len() < SPARE_COPIES) {
                    spare.push(copy);
                }
                started
            }
            Some(Err(e)) => Box::pin(std::future::ready(Err(e))),
            None => Box::pin(copy.oneshot(call)),
        }
    }
}

impl Service<ToolCall> for CallStack {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        // Readiness is the started copy's (see `start`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        self.start(call)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use carapace_filters::call::{Credential, Principal, SkillCredential, ToolSpec};
    use carapace_filters::canonical::hmac_sha256_hex;
    use carapace_filters::shared::{SharedNonces, SharedStateError};
    use carapace_filters::signature::{
        AuthMode, ReplayGuard, SignatureLayer, SignatureVerifier, SigningKey,
    };
    use tower::Layer;

    /// A call of tool `t`, with idempotency key `key`.
    pub(crate) fn tool_call(key: Option<&str>) -> ToolCall {
        ToolCall {
            call_id: "c1".into(),
            tool: Arc::new(ToolSpec {
                name: "t".into(),
                app_name: None,
                definition: None,
                description: String::new(),
                input: carapace_filters::schema::CompiledSchema::compile(
                    serde_json::json!({"type": "object"}),
                )
                .unwrap(),
                output: None,
                timeout_ms_default: 1_000,
                timeout_ms_max: 1_000,
                idempotent: false,
                side_effects: true,
            }),
            tenant_id: None,
            args: serde_json::json!({}),
            context: None,
            timeout_ms: None,
            idempotency_key: key.map(str::to_owned),
            principal: Arc::new(Principal::local()),
            credential: carapace_filters::call::Credential::None,
            request_id: None,
            trace_context: Vec::new(),
            extensions: Default::default(),
        }
    }

    /// Ready once polled a second time (waking its task), or refusing readiness; counts its
    /// copies and the calls that reach it.
    #[derive(Default)]
    struct Counted {
        copies: Arc<AtomicUsize>,
        calls: Arc<AtomicUsize>,
        polled: bool,
        waits: bool,
        refuses: bool,
    }

    impl Clone for Counted {
        fn clone(&self) -> Self {
            self.copies.fetch_add(1, Ordering::SeqCst);
            Counted {
                copies: self.copies.clone(),
                calls: self.calls.clone(),
                polled: false,
                ..*self
            }
        }
    }

    impl Service<ToolCall> for Counted {
        type Response = CallOutcome;
        type Error = Rejection;
        type Future = std::future::Ready<Result<CallOutcome, Rejection>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
            if self.refuses {
                return Poll::Ready(Err(Rejection::Overloaded));
            }
            if self.waits && !std::mem::replace(&mut self.polled, true) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: ToolCall) -> Self::Future {
            self.polled = false;
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(CallOutcome::Ok {
                output: serde_json::json!({}),
                meta: None,
                content: None,
            }))
        }
    }

    #[tokio::test]
    async fn a_copy_of_the_stack_that_started_a_call_starts_the_next() {
        let inner = Counted::default();
        let (copies, calls) = (inner.copies.clone(), inner.calls.clone());
        let stack = CallStack::new(inner);
        let before = copies.load(Ordering::SeqCst);
        for _ in 0..5 {
            assert!(stack.start(tool_call(None)).await.is_ok());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(
            copies.load(Ordering::SeqCst) - before,
            1,
            "one copy for five calls"
        );
        // Two calls in flight at once: the copy was back as soon as the first had started.
        let (a, b) = (stack.start(tool_call(None)), stack.start(tool_call(None)));
        assert!(a.await.is_ok() && b.await.is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 7);
        assert_eq!(copies.load(Ordering::SeqCst) - before, 1);
    }

    #[tokio::test]
    async fn a_layer_that_starts_a_call_on_its_own_stack_gets_a_copy_of_its_own() {
        // The spare copies are locked while a call starts: a layer that starts another call
        // on the same stack from its `call` must get a fresh copy, not wait for that lock.
        let stack = Arc::new(std::sync::OnceLock::<CallStack>::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = {
            let (stack, calls) = (stack.clone(), calls.clone());
            tower::service_fn(move |call: ToolCall| {
                calls.fetch_add(1, Ordering::SeqCst);
                let nested = (call.call_id.as_ref() == "outer").then(|| {
                    let mut inner = tool_call(None);
                    inner.call_id = "inner".into();
                    stack.get().expect("set").start(inner)
                });
                async move {
                    if let Some(nested) = nested {
                        nested.await?;
                    }
                    Ok(CallOutcome::Ok {
                        output: serde_json::json!({}),
                        meta: None,
                        content: None,
                    })
                }
            })
        };
        let _ = stack.set(CallStack::new(svc));
        let mut outer = tool_call(None);
        outer.call_id = "outer".into();
        let started = stack.get().unwrap().start(outer);
        let answered = tokio::time::timeout(Duration::from_secs(5), started).await;
        assert!(matches!(answered, Ok(Ok(_))), "{answered:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "the outer call and the one it started"
        );
        // The stack goes on starting calls on its kept copy.
        assert!(stack.get().unwrap().start(tool_call(None)).await.is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_stack_not_ready_at_once_is_waited_for_and_a_refusal_is_the_answer() {
        let inner = Counted {
            waits: true,
            ..Counted::default()
        };
        let (copies, calls) = (inner.copies.clone(), inner.calls.clone());
        let stack = CallStack::new(inner);
        let before = copies.load(Ordering::SeqCst);
        for _ in 0..2 {
            assert!(stack.start(tool_call(None)).await.is_ok());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // A copy that was waited for is not kept.
        assert_eq!(copies.load(Ordering::SeqCst) - before, 2);

        let inner = Counted {
            refuses: true,
            ..Counted::default()
        };
        let calls = inner.calls.clone();
        let refused = CallStack::new(inner).start(tool_call(None)).await;
        assert!(matches!(refused, Err(Rejection::Overloaded)), "{refused:?}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "a refusing stack is never called"
        );
    }

    /// A service that is called only after its readiness was polled since its last call (as
    /// tower's own limits insist), and counts the calls that reach it.
    #[derive(Default)]
    struct ReadyFirst {
        calls: Arc<AtomicUsize>,
        ready: bool,
    }

    impl Clone for ReadyFirst {
        fn clone(&self) -> Self {
            ReadyFirst {
                calls: self.calls.clone(),
                ready: false,
            }
        }
    }

    impl Service<ToolCall> for ReadyFirst {
        type Response = CallOutcome;
        type Error = Rejection;
        type Future = std::future::Ready<Result<CallOutcome, Rejection>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
            self.ready = true;
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: ToolCall) -> Self::Future {
            assert!(
                std::mem::take(&mut self.ready),
                "called before it was ready"
            );
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(CallOutcome::Ok {
                output: serde_json::json!({}),
                meta: None,
                content: None,
            }))
        }
    }

    /// Replicas' shared nonces in memory, answering only after a turn of the event loop.
    #[derive(Default)]
    struct SlowNonces(Mutex<std::collections::HashSet<String>>);

    impl SharedNonces for SlowNonces {
        fn insert_if_absent(
            &self,
            _: &str,
            nonce: &str,
            _: Duration,
        ) -> BoxFuture<Result<bool, SharedStateError>> {
            let fresh = self.0.lock().unwrap().insert(nonce.to_owned());
            Box::pin(async move {
                tokio::task::yield_now().await;
                Ok(fresh)
            })
        }
    }

    fn signed_call(nonce: &str) -> ToolCall {
        let ts = 1_735_689_600_000_i64;
        let canonical = format!(r#"{{"nonce":"{nonce}","timestamp":{ts}}}"#);
        let mut call = tool_call(None);
        call.credential = Credential::Skill(Box::new(SkillCredential {
            api_key: None,
            header_signature: None,
            signature_hex: hmac_sha256_hex(b"secret", canonical.as_bytes()),
            canonical,
            timestamp_ms: ts,
            nonce: nonce.into(),
            scope: "demo.echo".into(),
        }));
        call
    }

    /// The signature check with replicas' nonces moves the ready stack below it into the call
    /// and leaves an unready copy in its place: the copy kept for the next call is made ready
    /// again before that call, which is checked like the first.
    #[tokio::test]
    async fn a_kept_copy_after_an_asynchronous_check_is_made_ready_and_checks_the_next_call() {
        let inner = ReadyFirst::default();
        let calls = inner.calls.clone();
        let verifier = SignatureVerifier::new(
            AuthMode::Hmac,
            vec![SigningKey {
                id: "k".into(),
                secret: Arc::from(&b"secret"[..]),
            }],
            Duration::from_secs(120),
            ReplayGuard::Shared {
                store: Arc::new(SlowNonces::default()),
                ttl: Duration::from_secs(300),
            },
            Arc::new(|| 1_735_689_600_000),
        );
        let stack = CallStack::new(SignatureLayer::new(Arc::new(verifier)).layer(inner));
        for nonce in ["n1", "n2"] {
            assert!(stack.start(signed_call(nonce)).await.is_ok(), "{nonce}");
        }
        // Two at once on the kept copy, then a replay and a bad signature on it.
        let (a, b) = (
            stack.start(signed_call("n3")),
            stack.start(signed_call("n4")),
        );
        assert!(a.await.is_ok() && b.await.is_ok());
        let replay = stack.start(signed_call("n2")).await;
        assert!(matches!(replay, Err(Rejection::NonceReplay)), "{replay:?}");
        let mut forged = signed_call("n5");
        if let Credential::Skill(c) = &mut forged.credential {
            c.signature_hex = hmac_sha256_hex(b"wrong", c.canonical.as_bytes());
        }
        let forged = stack.start(forged).await;
        assert!(
            matches!(forged, Err(Rejection::AuthFailed(_))),
            "{forged:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 4, "the four honest calls");
    }

    /// Copies of the stack `stack` made for three calls on the current thread.
    async fn three_calls(stack: &CallStack, copies: &AtomicUsize) -> usize {
        let before = copies.load(Ordering::SeqCst);
        for _ in 0..3 {
            assert!(stack.start(tool_call(None)).await.is_ok());
        }
        copies.load(Ordering::SeqCst) - before
    }

    #[tokio::test]
    async fn each_worker_keeps_copies_of_its_own() {
        let inner = Counted::default();
        let copies = inner.copies.clone();
        let stack = CallStack::new(inner).for_workers(2);
        assert_eq!(three_calls(&stack, &copies).await, 1);
        // A second connection goes to worker 1, on its own thread: it makes a copy of its own
        // and keeps it; worker 0 (this thread) goes on with its kept one.
        let workers = crate::server::Workers::spawn(2).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut clients = Vec::new();
        let mut on_worker = Vec::new();
        for _ in 0..2 {
            let addr = listener.local_addr().unwrap();
            clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
            let (socket, _) = listener.accept().await.unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (stack, copies) = (stack.clone(), copies.clone());
            workers.serve(socket, move |_socket: tokio::net::TcpStream| async move {
                let made = three_calls(&stack, &copies).await;
                let again = three_calls(&stack, &copies).await;
                let _ = tx.send((crate::server::worker_index(), made, again));
            });
            on_worker.push(rx.await.unwrap());
        }
        workers.stop().await;
        assert_eq!(on_worker, vec![(0, 0, 0), (1, 1, 0)]);
        assert_eq!(three_calls(&stack, &copies).await, 0);
    }
}
