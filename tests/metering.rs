//! Metering: a priced tool, a consumer's budget that runs out mid-run, charges in the ledger,
//! and budgets that hold across a restart.

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn a_budget_runs_out_mid_run_and_the_next_call_is_refused_before_the_app() {
    let env = Env::new().await;
    let yaml = env.tools_yaml(
        "ledger: {}\ntools: { memory.append: { price: 10 } }\nmetering: { budgets: { gw_test: { total: 30 } } }",
    );
    let r = env.start(&yaml).await;
    let append = || call("memory.append", json!({"text": "paid"}));
    for _ in 0..3 {
        let reply = env
            .gateway(&r)
            .post_json("/v1/tools/call", &[], &append())
            .await
            .unwrap();
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    }
    let reply = env
        .gateway(&r)
        .post_json("/v1/tools/call", &[], &append())
        .await
        .unwrap();
    assert_eq!(code(&reply), "FORBIDDEN", "{:?}", reply.json());
    let details = &reply.json()["error"]["details"];
    assert_eq!(details["reason"], "budget_exhausted");
    assert_eq!(details["budget"], "total");
    assert_eq!(details["remaining"], 0);
    assert_eq!(details["price"], 10);
    assert_eq!(
        env.app.received().len(),
        3,
        "the refused call reached the app"
    );
    // Unpriced tools, and consumers without a budget, go on.
    let reply = env
        .gateway(&r)
        .post_json(
            "/v1/tools/call",
            &[],
            &call("memory.query", json!({"query": "p"})),
        )
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok");
    let reply = env
        .local(&r)
        .post_json("/v1/tools/call", &[], &append())
        .await
        .unwrap();
    assert_eq!(reply.json()["status"], "ok");
    r.shutdown().await;

    // The charges are in the ledger, with the rows.
    let out = std::process::Command::new(binary())
        .args(["ledger", "export", "--config"])
        .arg(env.path().join("carapace.yaml"))
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let charges: Vec<(String, Option<u64>)> = rows
        .iter()
        .map(|r| {
            (
                r["consumer"].as_str().unwrap().to_string(),
                r["charge"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        charges,
        [
            ("gw_test".into(), Some(10)),
            ("gw_test".into(), Some(10)),
            ("gw_test".into(), Some(10)),
            ("gw_test".into(), None),
            ("local".into(), Some(10)),
        ]
    );

    // After a restart the budget is still spent.
    let r = env.start(&yaml).await;
    let reply = env
        .gateway(&r)
        .post_json("/v1/tools/call", &[], &append())
        .await
        .unwrap();
    assert_eq!(code(&reply), "FORBIDDEN");
    assert_eq!(env.app.received().len(), 5);
    r.shutdown().await;
}

/// A priced call whose outcome is not known is charged: one that timed out and one its caller
/// cancelled after it reached the app (the app may have run both). The budget caps what the
/// consumer may have used, so neither is a way around it.
#[tokio::test]
async fn a_call_that_times_out_or_is_cancelled_is_charged() {
    let env = Env::new().await;
    let yaml = env.tools_yaml(
        "ledger: {}\ntools: { memory.query: { price: 10 } }\nmetering: { budgets: { gw_test: { total: 20 } } }",
    );
    let r = env.start(&yaml).await;
    let gw = env.gateway(&r);
    let mut timed = call("memory.query", json!({"query": "x", "delay_ms": 2000}));
    timed["timeout_ms"] = json!(100);
    let reply = gw.post_json("/v1/tools/call", &[], &timed).await.unwrap();
    assert_eq!(code(&reply), "TIMEOUT", "{:?}", reply.json());

    let slow = call("memory.query", json!({"query": "x", "delay_ms": 4000}));
    let cancel = json!({"version": "v1", "call_id": slow["call_id"]});
    let held = tokio::spawn({
        let gw = gw.clone();
        async move { gw.post_json("/v1/tools/call", &[], &slow).await.unwrap() }
    });
    wait_until(|| env.app.received().len() == 2).await;
    let cancelled = gw
        .post_json("/v1/tools/cancel", &[], &cancel)
        .await
        .unwrap();
    assert_eq!(cancelled.json()["cancelled"], true);
    assert_eq!(code(&held.await.unwrap()), "CANCELLED");

    let after = call("memory.query", json!({"query": "x"}));
    let reply = gw.post_json("/v1/tools/call", &[], &after).await.unwrap();
    assert_eq!(code(&reply), "FORBIDDEN", "{:?}", reply.json());
    assert_eq!(reply.json()["error"]["details"]["remaining"], 0);
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;

    let out = std::process::Command::new(binary())
        .args(["ledger", "export", "--config"])
        .arg(env.path().join("carapace.yaml"))
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let recorded: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["error_code"].as_str().unwrap(),
                r["charge"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(recorded, [("TIMEOUT", 10), ("CANCELLED", 10)]);
}
