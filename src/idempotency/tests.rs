use std::sync::atomic::{AtomicUsize, Ordering};

use carapace_filters::call::{Credential, Principal, ToolSpec};
use carapace_filters::schema::CompiledSchema;
use serde_json::json;
use tower::ServiceExt;

use super::*;

/// An app that counts its calls, answers `{"n": <count>}` after `delay`, or the given error.
#[derive(Clone)]
struct App {
    calls: Arc<AtomicUsize>,
    delay: Duration,
    retryable_error: bool,
}

impl Service<ToolCall> for App {
    type Response = CallOutcome;
    type Error = Rejection;
    type Future = BoxFuture<Result<CallOutcome, Rejection>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: ToolCall) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let (delay, retryable) = (self.delay, self.retryable_error);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Ok(match retryable {
                false => CallOutcome::Ok {
                    output: json!({"n": n}),
                    meta: None,
                    content: None,
                },
                true => CallOutcome::AppError {
                    code: "BUSY".into(),
                    message: String::new(),
                    details: None,
                    retryable: true,
                    content: None,
                },
            })
        })
    }
}

fn app(delay_ms: u64) -> App {
    App {
        calls: Arc::default(),
        delay: Duration::from_millis(delay_ms),
        retryable_error: false,
    }
}

fn settings(wait_ms: u64) -> Settings {
    Settings {
        window: Duration::from_secs(60),
        wait: Duration::from_millis(wait_ms),
        max_result_bytes: 1024,
        tools: Default::default(),
    }
}

fn keyed(args: serde_json::Value, key: Option<&str>, side_effects: bool) -> ToolCall {
    let spec = ToolSpec {
        name: "memory.append".into(),
        app_name: None,
        definition: None,
        description: String::new(),
        input: CompiledSchema::compile(json!({"type": "object"})).unwrap(),
        output: None,
        timeout_ms_default: 30_000,
        timeout_ms_max: 30_000,
        idempotent: false,
        side_effects,
    };
    ToolCall {
        call_id: "c1".into(),
        tool: Arc::new(spec),
        tenant_id: None,
        args,
        context: None,
        timeout_ms: None,
        idempotency_key: key.map(str::to_string),
        principal: Arc::new(Principal::local()),
        credential: Credential::None,
        request_id: None,
        trace_context: Vec::new(),
        extensions: Default::default(),
    }
}

#[tokio::test(start_paused = true)]
async fn twenty_concurrent_repeats_reach_the_app_once_and_get_one_answer() {
    let app = app(200);
    let svc = IdempotencyLayer::new(Arc::new(LocalKeys::new(100, 1 << 20)), settings(5_000))
        .layer(app.clone());
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let svc = svc.clone();
        set.spawn(svc.oneshot(keyed(json!({"text": "a"}), Some("k-1"), true)));
    }
    let mut answers = Vec::new();
    while let Some(r) = set.join_next().await {
        answers.push(r.unwrap().unwrap());
    }
    assert_eq!(app.calls.load(Ordering::SeqCst), 1);
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    // Later, within the window: still the stored answer.
    let again = svc
        .clone()
        .oneshot(keyed(json!({"text": "a"}), Some("k-1"), true))
        .await
        .unwrap();
    assert_eq!(again, answers[0]);
    assert_eq!(app.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_same_key_with_other_arguments_is_refused_before_the_app() {
    let app = app(0);
    let svc = IdempotencyLayer::new(Arc::new(LocalKeys::new(100, 1 << 20)), settings(1_000))
        .layer(app.clone());
    svc.clone()
        .oneshot(keyed(json!({"text": "a"}), Some("k"), true))
        .await
        .unwrap();
    let r = svc
        .clone()
        .oneshot(keyed(json!({"text": "b"}), Some("k"), true))
        .await;
    assert!(matches!(r, Err(Rejection::IdempotencyConflict)));
    assert_eq!(app.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn uncovered_calls_retryable_errors_and_bad_keys_are_not_deduplicated() {
    let app = app(0);
    let svc = IdempotencyLayer::new(Arc::new(LocalKeys::new(100, 1 << 20)), settings(1_000))
        .layer(app.clone());
    // No key, or a tool without side effects: every call runs.
    for call in [
        keyed(json!({}), None, true),
        keyed(json!({}), None, true),
        keyed(json!({}), Some("k"), false),
        keyed(json!({}), Some("k"), false),
    ] {
        svc.clone().oneshot(call).await.unwrap();
    }
    assert_eq!(app.calls.load(Ordering::SeqCst), 4);
    let bad = svc
        .clone()
        .oneshot(keyed(json!({}), Some("with space"), true))
        .await;
    assert!(matches!(bad, Err(Rejection::InvalidRequest { .. })));
    // A retryable error frees the key: the retry runs.
    let busy = App {
        retryable_error: true,
        ..app.clone()
    };
    let svc = IdempotencyLayer::new(Arc::new(LocalKeys::new(100, 1 << 20)), settings(1_000))
        .layer(busy.clone());
    for _ in 0..2 {
        svc.clone()
            .oneshot(keyed(json!({}), Some("k"), true))
            .await
            .unwrap();
    }
    assert_eq!(busy.calls.load(Ordering::SeqCst), 6);
}

#[tokio::test(start_paused = true)]
async fn a_repeat_waits_only_so_long_and_a_dropped_call_frees_its_key() {
    let app = app(10_000);
    let keys = Arc::new(LocalKeys::new(100, 1 << 20));
    let svc = IdempotencyLayer::new(keys.clone(), settings(100)).layer(app.clone());
    let first = tokio::spawn(svc.clone().oneshot(keyed(json!({}), Some("slow"), true)));
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let repeat = svc
        .clone()
        .oneshot(keyed(json!({}), Some("slow"), true))
        .await;
    assert!(matches!(repeat, Err(Rejection::IdempotencyPending)));
    first.abort();
    let _ = first.await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(keys.is_empty());
}

#[test]
fn the_store_is_bounded_and_keeps_running_calls() {
    let keys = LocalKeys::new(2, 1 << 20);
    let w = Duration::from_secs(60);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(
            keys.claim("a", "sha256:00", "t", w).await.unwrap(),
            Slot::Claimed
        );
        keys.finish("a", "t", "sha256:00", Some("{}".into()), w)
            .await
            .unwrap();
        assert_eq!(
            keys.claim("b", "sha256:00", "t", w).await.unwrap(),
            Slot::Claimed
        );
        // Full: the finished key goes, the running one stays.
        assert_eq!(
            keys.claim("c", "sha256:00", "t", w).await.unwrap(),
            Slot::Claimed
        );
        assert_eq!(
            keys.claim("b", "sha256:00", "u", w).await.unwrap(),
            Slot::Running {
                args_hash: "sha256:00".into()
            }
        );
        // Nothing finished to let go of: refused.
        assert!(matches!(
            keys.claim("d", "sha256:00", "t", w).await,
            Err(Rejection::Overloaded)
        ));
    });
}
