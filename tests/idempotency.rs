//! Idempotency at the shell: a keyed call to a tool with side effects runs once per caller,
//! tenant, memory scope, tool and key, on every front. (Across replicas on Redis: `tests/shared_state.rs`.)

mod common;

use common::mcp::{modern, modern_body};
use common::*;
use serde_json::{json, Value};

fn keyed(tool: &str, args: Value, key: &str) -> Value {
    let mut c = call(tool, args);
    c["idempotency_key"] = json!(key);
    c
}

#[tokio::test]
async fn twenty_concurrent_keyed_calls_reach_the_app_once_and_share_one_answer_and_receipt() {
    let env = Env::new().await;
    let r = env
        .start(&env.tools_yaml("receipts: { sign: true, provider_id: memory-host }"))
        .await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let client = env.local(&r);
        let body = keyed("memory.append", json!({"text": "pay once"}), "invoice-42");
        set.spawn(async move {
            client
                .post_json("/v1/tools/call", &[], &body)
                .await
                .unwrap()
        });
    }
    let mut seen = Vec::new();
    while let Some(reply) = set.join_next().await {
        let reply = reply.unwrap();
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
        seen.push((
            reply.json()["result"].clone(),
            reply.headers["carapace-receipt"].clone(),
        ));
    }
    assert_eq!(env.app.received().len(), 1, "a repeat reached the app");
    assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");

    // Same key, other arguments: refused before the app, with the reason in the details.
    let reply = env
        .local(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &keyed("memory.append", json!({"text": "pay twice"}), "invoice-42"),
        )
        .await
        .unwrap();
    assert_eq!(code(&reply), "INVALID_ARGS");
    assert_eq!(
        reply.json()["error"]["details"]["reason"],
        "idempotency_conflict"
    );
    // Another caller's same key is its own.
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &keyed("memory.append", json!({"text": "pay once"}), "invoice-42"),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok");
    assert_eq!(env.app.received().len(), 2);
    // The same caller's same key for another tenant, or another memory scope, is another call:
    // it reaches the app and gets its own answer, not the first one.
    let mut other_tenant = keyed("memory.append", json!({"text": "pay once"}), "invoice-42");
    other_tenant["tenant_id"] = json!("work");
    let mut other_scope = keyed("memory.append", json!({"text": "pay once"}), "invoice-42");
    other_scope["context"]["isolation_key"] = json!("user-7");
    for body in [other_tenant, other_scope] {
        let reply = env
            .local(&r)
            .post_json("/v1/tools/call", &[], &body)
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
        assert_ne!(reply.headers["carapace-receipt"], seen[0].1);
    }
    assert_eq!(env.app.received().len(), 4);
    // A tool without side effects runs every time.
    for _ in 0..2 {
        env.local(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &keyed("memory.query", json!({"query": "pay"}), "q-1"),
            )
            .await
            .unwrap();
    }
    assert_eq!(env.app.received().len(), 6);
    r.shutdown().await;
}

#[tokio::test]
async fn the_mcp_front_takes_the_key_from_meta_and_a_tool_can_opt_out() {
    let env = Env::new().await;
    let yaml = env
        .tools_yaml("tools: { memory.delete: { idempotency: false } }")
        .replace("front: { protocol: tools-v1 }", "front: { protocol: mcp }");
    let r = env.start(&yaml).await;
    let client = env.local(&r);
    let call_with_key = |tool: &str, args: Value, key: &str| {
        let mut body = modern_body(1, "tools/call", json!({"name": tool, "arguments": args}));
        body["params"]["_meta"]["io.carapace/idempotency-key"] = json!(key);
        body
    };
    for _ in 0..3 {
        let reply = modern(
            &client,
            &call_with_key("memory.append", json!({"text": "x"}), "k1"),
        )
        .await;
        assert_eq!(
            reply.json()["result"]["isError"],
            false,
            "{:?}",
            reply.json()
        );
    }
    assert_eq!(env.app.received().len(), 1);
    // Opted out: each call runs.
    for _ in 0..2 {
        modern(
            &client,
            &call_with_key("memory.delete", json!({"id": "m1"}), "k2"),
        )
        .await;
    }
    assert_eq!(env.app.received().len(), 3);
    // A key that is not a short visible string is refused.
    let reply = modern(
        &client,
        &call_with_key("memory.append", json!({"text": "x"}), "has space"),
    )
    .await;
    assert!(reply.json()["error"]["code"].is_i64(), "{:?}", reply.json());
    assert_eq!(env.app.received().len(), 3);
    r.shutdown().await;
}
