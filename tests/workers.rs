//! Workers: connections spread over event loops on threads of their own, every call served on
//! whichever worker took its connection, and the drain waiting for calls on every worker.

mod common;

use std::time::Duration;

use carapace::server::{self, Workers};
use common::{call, wait_until, Env};
use http::StatusCode;
use serde_json::json;

/// Threads of this process named as carapace's workers.
fn worker_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("carapace-worke"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_spread_over_the_workers_and_the_drain_waits_for_each() {
    let env = Env::new().await;
    let path = env.path().join("carapace.yaml");
    std::fs::write(&path, env.tools_yaml("")).unwrap();
    let loaded = carapace::config::load(&path).unwrap();
    let r = server::start_on(loaded, Workers::spawn(3).unwrap())
        .await
        .unwrap();
    wait_until(|| r.shared.ready()).await;
    assert_eq!(
        worker_threads(),
        2,
        "the runtime it started on, and two more"
    );

    // One connection per call, over mTLS: each worker takes two, and serves them.
    for i in 0..6 {
        let reply = env
            .gateway(&r)
            .post_json(
                "/v1/tools/call",
                &[],
                &call("memory.query", json!({"query": format!("q{i}")})),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    }
    let metrics = r.shared.metrics.encode();
    for worker in 0..3 {
        let line = format!("carapace_worker_connections_total{{worker=\"{worker}\"}} 2");
        assert!(metrics.contains(&line), "{line} missing from:\n{metrics}");
    }
    let queries: Vec<_> = env.app.received().iter().map(|r| r.body.clone()).collect();
    assert_eq!(queries.len(), 6, "every call reached the app once");

    // Three slow calls, one on each worker; the drain lets every one finish.
    let slow = (0..3).map(|i| {
        let mut body = call("memory.query", json!({"query": "s", "delay_ms": 700 + i}));
        body["timeout_ms"] = json!(10_000);
        let client = env.gateway(&r);
        tokio::spawn(async move { client.post_json("/v1/tools/call", &[], &body).await })
    });
    let slow: Vec<_> = slow.collect();
    let started = || {
        env.app
            .received()
            .iter()
            .filter(|r| r.body.to_string().contains("delay_ms"))
            .count()
            == 3
    };
    wait_until(started).await;
    tokio::time::timeout(Duration::from_secs(10), r.shutdown())
        .await
        .expect("the drain ended");
    for call in slow {
        let reply = call
            .await
            .unwrap()
            .expect("a slow call was cut by the drain");
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json()["status"], "ok", "{:?}", reply.json());
    }
    assert_eq!(worker_threads(), 0, "the workers stopped after the drain");
}
