use std::sync::Arc;
use std::time::Duration;

use carapace_filters::call::{Credential, Principal, ToolCall};
use carapace_filters::timeout::CallTimeoutLayer;
use carapace_filters::Rejection;
use serde_json::json;
use tower::{Layer, ServiceExt};

use super::*;
use crate::catalog::CatalogHandle;
use crate::relay::RelayRouter;

fn relay(config: CallerToolsConfig) -> (Arc<CallerTools>, Arc<CatalogHandle>) {
    let catalog = Arc::new(CatalogHandle::default());
    (CallerTools::new(config, catalog.clone()), catalog)
}

fn declared(name: &str) -> Declared {
    Declared {
        name: name.into(),
        description: format!("{name} does it"),
        input_schema: None,
    }
}

fn call_of(catalog: &CatalogHandle, name: &str, timeout_ms: Option<u64>) -> ToolCall {
    ToolCall {
        call_id: "c-1".into(),
        tool: catalog.load().get(name).cloned().expect("in the catalog"),
        tenant_id: None,
        args: json!({}),
        context: None,
        timeout_ms,
        idempotency_key: None,
        principal: Arc::new(Principal::local()),
        credential: Credential::None,
        request_id: None,
        trace_context: vec![],
        extensions: Default::default(),
    }
}

/// The call stage's timeout over the relay, with nothing behind it for other tools.
fn stage(
    relay: &Arc<CallerTools>,
) -> tower::util::BoxCloneSyncService<ToolCall, CallOutcome, Rejection> {
    let app = tower::util::BoxCloneSyncService::new(tower::service_fn(|c: ToolCall| async move {
        Err::<CallOutcome, _>(Rejection::ToolNotFound(c.tool.name.clone()))
    }));
    tower::util::BoxCloneSyncService::new(
        CallTimeoutLayer.layer(RelayRouter::new(relay.clone(), app)),
    )
}

#[tokio::test(start_paused = true)]
async fn req_ctr_001_a_caller_that_never_answers_times_out_after_60_s() {
    let (relay, catalog) = relay(CallerToolsConfig {
        max_pending_per_caller: 1,
        ..Default::default()
    });
    let (mut events, _guard) = relay
        .register("local", "myapp", vec![declared("slow_tool")])
        .unwrap();
    assert!(matches!(
        events.recv().await,
        Some(Event::Registered { .. })
    ));
    let started = tokio::time::Instant::now();
    let outcome = stage(&relay)
        .oneshot(call_of(&catalog, "myapp_slow_tool", None))
        .await;
    assert!(
        matches!(outcome, Err(Rejection::Timeout(60_000))),
        "{outcome:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    assert!(matches!(events.recv().await, Some(Event::Request { .. })));
    // The timed-out request is forgotten: the one pending slot is free again, and a late
    // answer to it is refused.
    let second = tokio::spawn({
        let stage = stage(&relay);
        let call = call_of(&catalog, "myapp_slow_tool", Some(1_000));
        async move { stage.oneshot(call).await }
    });
    let Some(Event::Request { .. }) = events.recv().await else {
        panic!("the second call is emitted");
    };
    assert!(matches!(
        second.await.unwrap(),
        Err(Rejection::Timeout(1_000))
    ));
}

#[test]
fn declarations_are_checked_and_names_stay_with_their_source() {
    let (relay, catalog) = relay(CallerToolsConfig::default());
    for (caller, tools) in [
        ("bad id", vec![declared("a")]),
        ("", vec![declared("a")]),
        ("myapp", vec![]),
        ("myapp", vec![declared("a b")]),
        ("myapp", vec![declared("a"), declared("a")]),
    ] {
        assert!(
            matches!(
                relay.register("local", caller, tools),
                Err(RelayError::Invalid(_))
            ),
            "{caller}"
        );
    }
    let bad_schema = Declared {
        name: "t".into(),
        description: String::new(),
        input_schema: Some(json!({"type": "nonsense"})),
    };
    assert!(matches!(
        relay.register("local", "myapp", vec![bad_schema]),
        Err(RelayError::Invalid(_))
    ));
    let (_events, guard) = relay
        .register("peer-a", "myapp", vec![declared("t")])
        .unwrap();
    assert!(catalog.load().get("myapp_t").is_some());
    // Another principal cannot take the caller id over; the same one can.
    assert!(matches!(
        relay.register("peer-b", "myapp", vec![declared("t")]),
        Err(RelayError::Forbidden(_))
    ));
    // Nor serve a name another caller serves (`my_app` + `t` and `my` + `app_t`).
    let (_e2, _g2) = relay
        .register("peer-a", "my_app", vec![declared("t")])
        .unwrap();
    assert!(matches!(
        relay.register("peer-b", "my", vec![declared("app_t")]),
        Err(RelayError::Invalid(_))
    ));
    drop(guard);
    assert!(catalog.load().get("myapp_t").is_none(), "withdrawn");
    assert!(catalog.base().tools.is_empty());
}

#[test]
fn a_configured_timeout_cap_lowers_the_wait_for_that_tool() {
    let catalog = Arc::new(CatalogHandle::default());
    let caps = [("myapp_quick".to_string(), 5_000)].into_iter().collect();
    let relay = CallerTools::with_timeout_caps(CallerToolsConfig::default(), catalog.clone(), caps);
    let (_e, _g) = relay
        .register("local", "myapp", vec![declared("quick"), declared("slow")])
        .unwrap();
    let quick = catalog.load().get("myapp_quick").cloned().unwrap();
    assert_eq!(
        (quick.timeout_ms_default, quick.timeout_ms_max),
        (5_000, 5_000)
    );
    let slow = catalog.load().get("myapp_slow").cloned().unwrap();
    assert_eq!(
        (slow.timeout_ms_default, slow.timeout_ms_max),
        (60_000, 300_000)
    );
}
