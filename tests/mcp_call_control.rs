//! MCP calls that end early: the caller cancels one in flight (2026-07-28 by closing the
//! response stream, older eras with `notifications/cancelled`), or the front refuses one from
//! its headers before the body is read (a switched-off tool, a tool over its rate limit).

mod common;

use carapace::server::Running;
use common::mcp::{front_yaml, modern, modern_body, post, start_front, MODERN};
use common::Env;
use http::StatusCode;
use serde_json::json;

/// A 2026-07-28 `tools/call` of `tool` whose head announces a body that never comes: what
/// carapace answered (within 3 s) without it.
async fn headers_only_call(r: &Running, tool: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         mcp-protocol-version: {MODERN}\r\nmcp-method: tools/call\r\nmcp-name: {tool}\r\n\
         content-length: 1000\r\n\r\n"
    );
    let mut s = tokio::net::UnixStream::connect(r.unix_path.clone().unwrap())
        .await
        .unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(3), s.read(&mut answer))
        .await
        .expect("answered without waiting for the body")
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// 2026-07-28: closing the response stream cancels the request. The caller goes away during a
/// slow `tools/call`; the request to the app is dropped.
#[tokio::test]
async fn closing_the_connection_during_a_call_drops_it_upstream() {
    use tokio::io::AsyncWriteExt;
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let body = modern_body(
        1,
        "tools/call",
        json!({"name": "memory.query", "arguments": {"query": "x", "delay_ms": 4000}}),
    )
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         mcp-protocol-version: {MODERN}\r\nmcp-method: tools/call\r\nmcp-name: memory.query\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::UnixStream::connect(r.unix_path.clone().unwrap())
        .await
        .unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    common::wait_until(|| env.app.received().len() == 1).await;
    drop(s);
    common::wait_until(|| env.app.abandoned() == 1).await;
}

/// Older eras: `notifications/cancelled` naming a call in flight ends it, upstream too.
#[tokio::test]
async fn a_cancelled_notification_drops_the_call_in_flight() {
    let env = Env::new().await;
    let r = start_front(&env, "").await;
    let gw = env.gateway(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
    let i = post(&gw, &init, &[]).await;
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    let h = vec![("mcp-session-id", session)];
    let slow = json!({"jsonrpc": "2.0", "id": "slow-1", "method": "tools/call",
        "params": {"name": "memory.query", "arguments": {"query": "x", "delay_ms": 4000}}});
    let call = tokio::spawn({
        let (gw, h) = (gw.clone(), h.clone());
        async move { post(&gw, &slow, &h).await }
    });
    common::wait_until(|| env.app.received().len() == 1).await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "slow-1", "reason": "user"}});
    assert_eq!(post(&gw, &cancel, &h).await.status, StatusCode::ACCEPTED);
    let answer = call.await.unwrap();
    assert_eq!(answer.json()["id"], "slow-1");
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cancelled"));
    common::wait_until(|| env.app.abandoned() == 1).await;
    // Recorded with its tool, as the tools-v1 front records a cancelled call.
    let m = env
        .ops(&r)
        .send(http::Method::GET, "/metrics", &[], "")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&m.body);
    let line = r#"carapace_requests_total{front="mcp",tool="memory.query",outcome="CANCELLED",reason="cancelled"} 1"#;
    assert!(text.contains(line), "missing {line} in\n{text}");
}

/// A 2026-07-28 `tools/call` to a switched-off tool is refused from its headers, before the
/// body is read (here the body never comes); an older-era call gets the refusal as a tool
/// result from the call stage.
#[tokio::test]
async fn a_kill_switched_tool_is_refused_from_the_headers() {
    let env = Env::new().await;
    let r = env
        .start(&front_yaml(
            &env,
            "",
            "kill_switch: { tools: [memory.append] }",
        ))
        .await;
    let answer = headers_only_call(&r, "memory.append").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains(r#""id":null"#), "{answer}");
    assert!(answer.contains("DEPENDENCY_UNAVAILABLE"), "{answer}");

    // The older era: the call stage answers, as a tool result a model can read.
    let gw = env.gateway(&r);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
    let i = post(&gw, &init, &[]).await;
    let session = i.headers["mcp-session-id"].to_str().unwrap().to_string();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "memory.append", "arguments": {"text": "x"}}});
    let c = post(&gw, &call, &[("mcp-session-id", session)]).await;
    assert_eq!(c.json()["result"]["isError"], true, "{:?}", c.json());
    assert_eq!(
        c.json()["result"]["_meta"]["dev.carapace/error"]["code"],
        "DEPENDENCY_UNAVAILABLE"
    );
    assert!(env.app.received().is_empty());
}

/// A 2026-07-28 `tools/call` takes its per-tool rate-limit cell from the headers: the first
/// call is counted once (a burst of one lets it through), the next is refused before its body
/// is read, and an older-era call draws on the same bucket.
#[tokio::test]
async fn a_tool_over_its_rate_limit_is_refused_from_the_headers_and_counted_once() {
    let env = Env::new().await;
    let r = env
        .start(&front_yaml(
            &env,
            "",
            "rate_limits: { tools: { memory.append: { per_minute: 1, burst: 1 } } }",
        ))
        .await;
    let gw = env.gateway(&r);
    let call = modern_body(
        1,
        "tools/call",
        json!({"name": "memory.append", "arguments": {"text": "once"}}),
    );
    let first = modern(&gw, &call).await;
    assert_eq!(
        first.json()["result"]["isError"],
        false,
        "{:?}",
        first.json()
    );
    assert_eq!(env.app.received().len(), 1);

    let answer = headers_only_call(&r, "memory.append").await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after:"),
        "{answer}"
    );
    assert!(answer.contains(r#""id":null"#), "{answer}");
    assert!(answer.contains("RATE_LIMITED"), "{answer}");

    // Another tool has its own bucket.
    let other = modern_body(
        2,
        "tools/call",
        json!({"name": "memory.query", "arguments": {"query": "once"}}),
    );
    assert_eq!(modern(&gw, &other).await.json()["result"]["isError"], false);

    // The older era meets the same bucket in the call stage.
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
    let session = post(&gw, &init, &[]).await.headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let legacy = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "memory.append", "arguments": {"text": "again"}}});
    let c = post(&gw, &legacy, &[("mcp-session-id", session)]).await;
    assert_eq!(
        c.json()["result"]["_meta"]["dev.carapace/error"]["code"],
        "RATE_LIMITED",
        "{:?}",
        c.json()
    );
    assert_eq!(
        env.app.received().len(),
        2,
        "only the first append and the query"
    );
}

/// A peer over its own rate limit spends no tool's cell: the per-peer limit answers first, so
/// its headers-only calls to a tool, however many, leave the tool's limit to other peers. And a
/// name no tool has takes no cell of the default per-tool limit.
#[tokio::test]
async fn a_peer_over_its_limit_spends_no_cell_of_a_tool_others_call() {
    let env = Env::new().await;
    let r = env
        .start(&front_yaml(
            &env,
            "",
            "rate_limits: { per_peer: { per_minute: 1, burst: 1 }, per_tool: { per_minute: 2, burst: 2 } }",
        ))
        .await;
    let call = |text: &str| {
        modern_body(
            1,
            "tools/call",
            json!({"name": "memory.append", "arguments": {"text": text}}),
        )
    };
    // The local socket's one call a minute, then its calls are over its own limit.
    let first = modern(&env.local(&r), &call("mine")).await;
    assert_eq!(
        first.json()["result"]["isError"],
        false,
        "{:?}",
        first.json()
    );
    for tool in [
        "memory.append",
        "memory.append",
        "memory.append",
        "no.such.tool",
    ] {
        let answer = headers_only_call(&r, tool).await;
        assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    }
    // The tool's second cell is still there for the gateway.
    let theirs = modern(&env.gateway(&r), &call("theirs")).await;
    assert_eq!(
        theirs.json()["result"]["isError"],
        false,
        "{:?}",
        theirs.json()
    );
    assert_eq!(env.app.received().len(), 2);
    r.shutdown().await;
}
