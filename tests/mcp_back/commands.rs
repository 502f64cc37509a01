//! MCP servers run as commands (stdio): a crashing server is restarted, one flooding its output
//! with garbage is survived, and a command's settings are checked before anything starts.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use super::common::mcp::{interop, json_list, start, yaml};
use super::common::{code, Env};
use super::tools_call;

/// A stdio server that crashes is restarted: the call that crashed it and every call in flight
/// fail at once with DEPENDENCY_UNAVAILABLE, and calls after the restart succeed. A server
/// flooding stdout and stderr with garbage does not take carapace down.
#[tokio::test]
async fn a_crashing_stdio_server_is_restarted_and_its_calls_in_flight_fail_at_once() {
    let env = Env::new().await;
    let starts = env.path().join("starts");
    let argv = [
        "python3".to_string(),
        interop("crashy_mcp_server.py").display().to_string(),
    ];
    let path = std::env::var("PATH").unwrap_or_default();
    let r = start(
        &env,
        &yaml(
            &env,
            "tools-v1",
            &format!(
                "command: {}, env: {{ PATH: \"{path}\", STARTS_FILE: \"{}\" }}",
                json_list(&argv),
                starts.display()
            ),
        ),
    )
    .await;
    let local = env.local(&r);
    let started = |n: usize| {
        let starts = starts.clone();
        move || std::fs::read_to_string(&starts).map_or(0, |s| s.lines().count()) >= n
    };
    assert_eq!(code(&tools_call(&local, "ok", json!({})).await), "");

    let slow = {
        let local = env.local(&r);
        tokio::spawn(async move { tools_call(&local, "slow", json!({})).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crashed = tools_call(&local, "crash", json!({})).await;
    assert_eq!(
        code(&crashed),
        "DEPENDENCY_UNAVAILABLE",
        "{:?}",
        crashed.json()
    );
    let slow = tokio::time::timeout(Duration::from_secs(5), slow)
        .await
        .expect("the call in flight fails at once, not at its timeout")
        .unwrap();
    assert_eq!(code(&slow), "DEPENDENCY_UNAVAILABLE", "{:?}", slow.json());

    for _ in 0..200 {
        if started(2)() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started(2)(), "restarted");
    let mut after = tools_call(&local, "ok", json!({})).await;
    for _ in 0..50 {
        if after.json()["status"] == "ok" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = tools_call(&local, "ok", json!({})).await;
    }
    assert_eq!(after.json()["status"], "ok", "{:?}", after.json());

    let flooded = tools_call(&local, "garbage", json!({})).await;
    assert_eq!(flooded.json()["status"], "ok", "{:?}", flooded.json());
    assert_eq!(
        flooded.json()["result"]["content"][0]["text"],
        "garbage done"
    );
    assert_eq!(
        tools_call(&local, "ok", json!({})).await.status,
        StatusCode::OK
    );
    assert!(!started(3)(), "the garbage did not cost a restart");
    r.shutdown().await;
}

/// A command's settings are checked before anything starts.
#[tokio::test]
async fn command_configuration_mistakes_are_refused() {
    let env = Env::new().await;
    let cases = [
        (
            "command: [node], working_dir: /nonexistent/dir",
            "/app/working_dir",
        ),
        (
            "command: [node], limits: { open_files: 0 }",
            "/app/limits/open_files",
        ),
        ("command: [\"\"]", "/app/command"),
        ("command: [node], env: { \"A=B\": x }", "/app/env/A=B"),
        (
            "command: [node], env: { KEY: { env: CARAPACE_TEST_UNSET_VARIABLE } }",
            "/app/env/KEY",
        ),
        (
            "address: \"unix:/tmp/x.sock\", mcp: { path: mcp }",
            "/app/mcp/path",
        ),
        ("limits: { cpu_seconds: 5 }", "/app/address"),
    ];
    for (app, path) in cases {
        let errors = carapace::config::parse(&yaml(&env, "mcp", app), env.path())
            .expect_err(path)
            .0;
        assert!(
            errors.iter().any(|e| e.to_string().contains(path)),
            "{path}: {:?}",
            errors.iter().map(|e| e.to_string()).collect::<Vec<_>>()
        );
    }
}
